/* The per-row loops of the binary COPY snapshot reader (pgcdc_dagster.native).
 *
 * Called through ctypes once per receive buffer or batch, never per row. Every function
 * reads only inside the bytes it is given and reports a fault by its return value; the
 * Python side then takes its own careful path, which names the fault. The results are the
 * same as the numpy code's in pgcdc_dagster/cdc/copy_frames.py and copy_columns.py
 * (tests/unit/test_native_copyscan.py proves it over randomised buffers).
 */
#include <stdint.h>

static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint16_t be16(const uint8_t *p)
{
    return (uint16_t)(((uint16_t)p[0] << 8) | p[1]);
}

/* The row messages that follow each other from data[pos]: 'd', an Int32 length (itself
 * included, 6 .. 2^31-1) and a tuple with ncols fields, each complete before end. Stops at
 * the first other message (a non-row message, the trailer, another field count, a length
 * out of range) or incomplete one, or after cap rows. Row i's tuple is
 * data[starts[i]:ends[i]]; *stop is where the next message starts. Returns the row count. */
int64_t pgcdc_frame_rows(const uint8_t *data, int64_t pos, int64_t end, int32_t ncols,
                         int64_t *starts, int64_t *ends, int64_t cap, int64_t *stop)
{
    int64_t n = 0;
    while (n < cap && end - pos >= 7 && data[pos] == 'd') {
        uint32_t length = be32(data + pos + 1);
        if (length < 6 || length >= 0x80000000u)
            break;
        if (be16(data + pos + 5) != (uint16_t)ncols)
            break;
        int64_t next = pos + 1 + (int64_t)length;
        if (next > end)
            break;
        starts[n] = pos + 5;
        ends[n] = next;
        n++;
        pos = next;
    }
    *stop = pos;
    return n;
}

/* The fields of n tuples: row i is data[row_start[i]:row_end[i]] (an Int16 field count, then
 * per field an Int32 length, -1 for NULL, and the value). Column c's value of row i starts
 * at starts[c * n + i] and is lengths[c * n + i] bytes long (-1: NULL). Returns 0, or 1 + the
 * first malformed row (another field count, a length below -1, a field past the row's end,
 * a row whose fields end before its end, a row outside the size bytes of data). */
int64_t pgcdc_walk_fields(const uint8_t *data, int64_t size, const int64_t *row_start,
                          const int64_t *row_end, int64_t n, int32_t ncols, int64_t *starts,
                          int32_t *lengths)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = row_start[i], end = row_end[i];
        if (pos < 0 || end > size || end - pos < 2 || be16(data + pos) != (uint16_t)ncols)
            return i + 1;
        pos += 2;
        for (int32_t c = 0; c < ncols; c++) {
            if (end - pos < 4)
                return i + 1;
            int32_t length = (int32_t)be32(data + pos);
            if (length < -1)
                return i + 1;
            pos += 4;
            starts[(int64_t)c * n + i] = pos;
            lengths[(int64_t)c * n + i] = length;
            if (length > 0) {
                if (end - pos < length)
                    return i + 1;
                pos += length;
            }
        }
        if (pos != end)
            return i + 1;
    }
    return 0;
}
