"""decoderbufs' Protobuf messages (``proto/pg_logicaldec.proto``, decoderbufs 2.x), built
from a descriptor written out here, since no protoc is available: the protobuf runtime then
parses rows natively.

``RowMessage``: 1 transaction_id, 2 commit_time (µs since the Unix epoch), 3 table
(``quote_qualified_identifier``), 4 op (0 INSERT, 1 UPDATE, 2 DELETE, 3 BEGIN, 4 COMMIT),
5 new_tuple and 6 old_tuple (``DatumMessage``), 7 new_typeinfo (not declared: skipped as an
unknown field). ``DatumMessage``: 1 column_name (``quote_identifier``), 2 column_type (oid),
oneof datum {3 int32, 4 int64, 5 float, 6 double, 7 bool, 8 string, 9 bytes, 10 Point
{1 x, 2 y}, 11 datum_missing (an unchanged TOAST value)}; no datum at all is NULL.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (message, [(field, number, type, label, message type, oneof index)], [oneofs])
_MESSAGES: list[tuple[str, list[tuple[str, int, int, int, str | None, int | None]],
                      tuple[str, ...]]] = [
    ("Point", [("x", 1, _F.TYPE_DOUBLE, _OPT, None, None),
               ("y", 2, _F.TYPE_DOUBLE, _OPT, None, None)], ()),
    ("DatumMessage", [
        ("column_name", 1, _F.TYPE_STRING, _OPT, None, None),
        ("column_type", 2, _F.TYPE_INT64, _OPT, None, None),
        ("datum_int32", 3, _F.TYPE_INT32, _OPT, None, 0),
        ("datum_int64", 4, _F.TYPE_INT64, _OPT, None, 0),
        ("datum_float", 5, _F.TYPE_FLOAT, _OPT, None, 0),
        ("datum_double", 6, _F.TYPE_DOUBLE, _OPT, None, 0),
        ("datum_bool", 7, _F.TYPE_BOOL, _OPT, None, 0),
        ("datum_string", 8, _F.TYPE_STRING, _OPT, None, 0),
        ("datum_bytes", 9, _F.TYPE_BYTES, _OPT, None, 0),
        ("datum_point", 10, _F.TYPE_MESSAGE, _OPT, ".decoderbufs.Point", 0),
        ("datum_missing", 11, _F.TYPE_BOOL, _OPT, None, 0)], ("datum",)),
    ("RowMessage", [
        ("transaction_id", 1, _F.TYPE_UINT32, _OPT, None, None),
        ("commit_time", 2, _F.TYPE_UINT64, _OPT, None, None),
        ("table", 3, _F.TYPE_STRING, _OPT, None, None),
        ("op", 4, _F.TYPE_INT32, _OPT, None, None),
        ("new_tuple", 5, _F.TYPE_MESSAGE, _REP, ".decoderbufs.DatumMessage", None),
        ("old_tuple", 6, _F.TYPE_MESSAGE, _REP, ".decoderbufs.DatumMessage", None)], ()),
]


def _classes() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="pgcdc_pg_logicaldec.proto",
                                            package="decoderbufs", syntax="proto2")
    for name, fields, oneofs in _MESSAGES:
        message = fd.message_type.add(name=name)
        for oneof in oneofs:
            message.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, oneof_index in fields:
            field = message.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name is not None:
                field.type_name = type_name
            if oneof_index is not None:
                field.oneof_index = oneof_index
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"decoderbufs.{name}")) for name, _, _ in _MESSAGES}


_CLASSES = _classes()
ROW: Any = _CLASSES["RowMessage"]
DATUM: Any = _CLASSES["DatumMessage"]
