/* The per-row loops of the binary COPY snapshot reader (pgcdc_dagster.native).
 *
 * Called through ctypes once per receive buffer or batch, never per row. Every function
 * reads only inside the bytes it is given and reports a fault by its return value; the
 * Python side then takes its own careful path, which names the fault. The results are the
 * same as the numpy code's in pgcdc_dagster/cdc/copy_frames.py and copy_columns.py
 * (tests/unit/test_native_copyscan.py proves it over randomised buffers).
 */
#include <stdint.h>
#include <string.h>

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

/* NUMERIC(p,s) values with p <= 18 as unscaled int64 (value * 10^scale, signed; 0 for a NULL
 * row, lengths[i] < 0). Each value's header: Int16 ndigits, weight, sign, dscale, then ndigits
 * base-10000 digits. Returns 0, or 1 when any value needs the numpy code's own judgement:
 * NaN or an infinity, a length other than 8 + 2 * ndigits, a leading zero digit or one
 * outside 0..9999, more digits than the scale keeps, or a value beyond the float bound
 * (first digit + 1) * pow10f[clip(4 * weight + scale, -40, 40) + 40] > limit, the same
 * doubles as the numpy code's, so the same values pass. */
int64_t pgcdc_numeric_unscaled(const uint8_t *data, const int64_t *starts,
                               const int32_t *lengths, int64_t n, int32_t scale,
                               const double *pow10f, double limit, int64_t *out)
{
    static const int64_t pow10[19] = {
        1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
        1000000000LL, 10000000000LL, 100000000000LL, 1000000000000LL, 10000000000000LL,
        100000000000000LL, 1000000000000000LL, 10000000000000000LL, 100000000000000000LL,
        1000000000000000000LL};
    for (int64_t i = 0; i < n; i++) {
        int32_t length = lengths[i];
        if (length < 0) {
            out[i] = 0;
            continue;
        }
        if (length < 8)
            return 1;
        const uint8_t *p = data + starts[i];
        int64_t ndigits = (int16_t)be16(p), weight = (int16_t)be16(p + 2);
        uint16_t sign = be16(p + 4);
        if ((sign != 0 && sign != 0x4000) || ndigits < 0 || length != 8 + 2 * ndigits)
            return 1;
        int64_t value = 0;
        if (ndigits > 0) {
            int64_t first = (int16_t)be16(p + 8);
            if (first <= 0 || first > 9999)
                return 1;
            int64_t e = 4 * weight + scale;
            e = e < -40 ? -40 : (e > 40 ? 40 : e);
            if (!((double)(first + 1) * pow10f[e + 40] <= limit))
                return 1;
        }
        for (int64_t k = 0; k < ndigits; k++) {
            int64_t digit = (int16_t)be16(p + 8 + 2 * k);
            if (digit < 0 || digit > 9999)
                return 1;
            int64_t exponent = 4 * (weight - k) + scale, term;
            if (exponent >= 0) {
                if (exponent > 18 || __builtin_mul_overflow(digit, pow10[exponent], &term))
                    return 1;
            } else {
                if (exponent < -18 || digit % pow10[-exponent] != 0)
                    return 1;
                term = digit / pow10[-exponent];
            }
            if (__builtin_add_overflow(value, term, &value))
                return 1;
        }
        out[i] = sign == 0x4000 ? -value : value;
    }
    return 0;
}

static void digits(uint8_t *out, int64_t value, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (uint8_t)('0' + value % 10);
        value /= 10;
    }
}

/* "YYYY-MM-DDTHH:MM:SS[.f{width}]Z" of Unix epoch microseconds within years 1-9999 (the
 * caller checks the range), one record of itemsize bytes per row that is not NULL (null[i]
 * nonzero), written one after another into out. Dates by H. Hinnant's civil-from-days;
 * the fraction's first `width` digits (truncated). */
void pgcdc_zoned_strings(const int64_t *micros, const uint8_t *null, int64_t n,
                         int32_t width, uint8_t *out, int64_t itemsize)
{
    const int64_t per_day = 86400000000LL;
    for (int64_t i = 0; i < n; i++) {
        if (null && null[i])
            continue;
        int64_t m = micros[i];
        int64_t days = m / per_day, rest = m % per_day;
        if (rest < 0) {
            rest += per_day;
            days -= 1;
        }
        int64_t seconds = rest / 1000000, fraction = rest % 1000000;
        int64_t z = days + 719468;
        int64_t era = (z >= 0 ? z : z - 146096) / 146097;
        int64_t doe = z - era * 146097;
        int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        int64_t mp = (5 * doy + 2) / 153;
        int64_t day = doy - (153 * mp + 2) / 5 + 1;
        int64_t month = mp < 10 ? mp + 3 : mp - 9;
        int64_t year = yoe + era * 400 + (month <= 2);
        digits(out, year, 4);
        out[4] = '-';
        digits(out + 5, month, 2);
        out[7] = '-';
        digits(out + 8, day, 2);
        out[10] = 'T';
        digits(out + 11, seconds / 3600, 2);
        out[13] = ':';
        digits(out + 14, seconds / 60 % 60, 2);
        out[16] = ':';
        digits(out + 17, seconds % 60, 2);
        if (width > 0) {
            uint8_t six[6];
            digits(six, fraction, 6);
            out[19] = '.';
            for (int k = 0; k < width && k < 6; k++)
                out[20 + k] = six[k];
        }
        out[itemsize - 1] = 'Z';
        out += itemsize;
    }
}

/* Arrow string offsets of n values (the bytes after the first `skip` of each; a NULL row,
 * lengths[i] < 0, is empty): offsets[0..n]. Returns the total byte count, or -1 - i when row
 * i is shorter than skip, or -1 - n when the total passes 2^31 - 1. */
int64_t pgcdc_string_offsets(const int32_t *lengths, int64_t n, int32_t skip, int32_t *offsets)
{
    int64_t total = 0;
    offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t length = lengths[i];
        if (length >= 0) {
            if (length < skip)
                return -1 - i;
            total += length - skip;
            if (total > 0x7FFFFFFFLL)
                return -1 - n;
        }
        offsets[i + 1] = (int32_t)total;
    }
    return total;
}

/* The values' bytes one after another (after pgcdc_string_offsets). */
void pgcdc_string_bytes(const uint8_t *data, const int64_t *starts, const int32_t *offsets,
                        int64_t n, int32_t skip, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        int32_t size = offsets[i + 1] - offsets[i];
        if (size > 0)
            memcpy(out + offsets[i], data + starts[i] + skip, (size_t)size);
    }
}

/* Fixed-width big-endian values (width 1, 2, 4 or 8 bytes) in the host's byte order (the
 * caller checks it is little-endian): out holds n values of width bytes, 0 for a NULL row
 * (lengths[i] < 0). Returns 0, or 1 + i when row i's value has another width. */
int64_t pgcdc_fixed_values(const uint8_t *data, const int64_t *starts, const int32_t *lengths,
                           int64_t n, int32_t width, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        uint8_t *o = out + i * width;
        if (lengths[i] < 0) {
            memset(o, 0, (size_t)width);
            continue;
        }
        if (lengths[i] != width)
            return 1 + i;
        const uint8_t *p = data + starts[i];
        switch (width) {
        case 8: {
            uint64_t v;
            memcpy(&v, p, 8);
            v = __builtin_bswap64(v);
            memcpy(o, &v, 8);
            break;
        }
        case 4: {
            uint32_t v;
            memcpy(&v, p, 4);
            v = __builtin_bswap32(v);
            memcpy(o, &v, 4);
            break;
        }
        case 2:
            o[0] = p[1];
            o[1] = p[0];
            break;
        default:
            for (int32_t k = 0; k < width; k++)
                o[k] = p[width - 1 - k];
        }
    }
    return 0;
}

/* Kafka Connect Decimal bytes of unscaled int64 values: each value's shortest big-endian
 * two's complement (1 to 8 bytes); a NULL row (null[i] nonzero, null may be 0) is empty.
 * offsets[0..n] and the bytes (at most 8 per row) into out. */
void pgcdc_decimal_bytes(const int64_t *unscaled, const uint8_t *null, int64_t n,
                         int32_t *offsets, uint8_t *out)
{
    int32_t total = 0;
    offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!(null && null[i])) {
            int64_t v = unscaled[i];
            uint64_t magnitude = (uint64_t)(v < 0 ? ~v : v);
            int length = 1;
            while (length < 8 && magnitude >= (1ULL << (8 * length - 1)))
                length++;
            uint64_t bits = (uint64_t)v;
            for (int k = length - 1; k >= 0; k--) {
                out[total + k] = (uint8_t)(bits & 0xFF);
                bits >>= 8;
            }
            total += length;
        }
        offsets[i + 1] = total;
    }
}
