/*
 * Column-at-a-time helpers of the ingest job (docs/ingest.md, "Performance").
 *
 * join_lines(validity, offsets, data, n, first) joins the n values of an Arrow binary
 * array (int32 offsets, array offset ``first``) with '\n' between them, a null value
 * written as "{}": the input of pyarrow's JSON reader. Returns None when a value holds
 * '\n' or '\r' (one value would not be one line).
 *
 * avro_flat(validity, offsets, data, n, first, header, codes) decodes n Avro values in
 * the Confluent wire format (``header``: magic byte + schema id, the same for every
 * value) of a flat record schema into Arrow buffers, one field per code:
 *   b boolean, i int, l long, f float, d double, s string, y bytes;
 * upper case: the union ["null", T], with a '~' after it: [T, "null"].
 * Returns a list with, per field, (validity or None, null count, values) for fixed-width
 * fields (booleans as a bitmap) or (validity or None, null count, int64 offsets, data) for
 * strings and bytes; None when any value is null, has another header, is malformed,
 * does not end where its record ends, holds invalid UTF-8 in a string, an int out of
 * the 32-bit range or a boolean byte other than 0/1: the caller then decodes value by
 * value.
 *
 * json_flat(validity, offsets, data, n, first) parses n JSON values, each an object of
 * flat fields (numbers, strings, true/false, null; a null value is a row of nulls), into
 * one Arrow column per field: long (integers within 64 bits), double (numbers with a
 * fraction or exponent, strtod-rounded as Python's float(); longs widen to it when a
 * field has both), boolean or string (escapes decoded, UTF-8 checked). Returns None where
 * the value-by-value path could differ: nested values, malformed JSON, escaped or
 * duplicate keys, lone surrogates, integers past 64 bits, non-finite numbers, a field
 * with strings or booleans and another kind, more than 64 fields.
 *
 * Every read is bounds-checked. Only the CPython C API is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ shared */

typedef struct {
    Py_buffer validity, offsets, data;
    int has_validity;
    Py_ssize_t n, first;
} BinaryInput;

static void release_input(BinaryInput *in)
{
    if (in->has_validity)
        PyBuffer_Release(&in->validity);
    if (in->offsets.obj != NULL)
        PyBuffer_Release(&in->offsets);
    if (in->data.obj != NULL)
        PyBuffer_Release(&in->data);
}

/* Fill ``in`` from (validity or None, offsets, data, n, first); 0 or -1 (exception set). */
static int parse_input(PyObject *validity, PyObject *offsets, PyObject *data, Py_ssize_t n,
                       Py_ssize_t first, BinaryInput *in)
{
    memset(in, 0, sizeof(*in));
    in->n = n;
    in->first = first;
    if (n < 0 || first < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length or offset");
        return -1;
    }
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &in->validity, PyBUF_SIMPLE) < 0)
            return -1;
        in->has_validity = 1;
        if (in->validity.len * 8 < first + n) {
            PyErr_SetString(PyExc_ValueError, "validity bitmap too short");
            goto fail;
        }
    }
    if (PyObject_GetBuffer(offsets, &in->offsets, PyBUF_SIMPLE) < 0)
        goto fail;
    if (PyObject_GetBuffer(data, &in->data, PyBUF_SIMPLE) < 0)
        goto fail;
    if (in->offsets.len < (first + n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer too short");
        goto fail;
    }
    const int32_t *offs = (const int32_t *)in->offsets.buf + first;
    for (Py_ssize_t i = 0; i < n; i++) { /* monotonic and inside data: reads are safe */
        if (offs[i] < 0 || offs[i + 1] < offs[i]) {
            PyErr_SetString(PyExc_ValueError, "offsets not monotonic");
            goto fail;
        }
    }
    if ((Py_ssize_t)offs[n] > in->data.len) {
        PyErr_SetString(PyExc_ValueError, "offsets past the data buffer");
        goto fail;
    }
    return 0;
fail:
    release_input(in);
    return -1;
}

static inline int is_valid(const BinaryInput *in, Py_ssize_t i)
{
    if (!in->has_validity)
        return 1;
    Py_ssize_t bit = in->first + i;
    return (((const uint8_t *)in->validity.buf)[bit >> 3] >> (bit & 7)) & 1;
}

#include "../protocol/native_common.h"

/* ------------------------------------------------------------------ join_lines */

static PyObject *join_lines(PyObject *self, PyObject *args)
{
    PyObject *validity, *offsets, *data;
    Py_ssize_t n, first;
    BinaryInput in;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnn", &validity, &offsets, &data, &n, &first))
        return NULL;
    if (parse_input(validity, offsets, data, n, first, &in) < 0)
        return NULL;
    const int32_t *offs = (const int32_t *)in.offsets.buf + first;
    const char *src = (const char *)in.data.buf;
    Py_ssize_t total = n ? n - 1 : 0;
    for (Py_ssize_t i = 0; i < n; i++)
        total += is_valid(&in, i) ? (Py_ssize_t)(offs[i + 1] - offs[i]) : 2;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        release_input(&in);
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    Py_ssize_t pos = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        if (i)
            dst[pos++] = '\n';
        if (!is_valid(&in, i)) {
            dst[pos++] = '{';
            dst[pos++] = '}';
            continue;
        }
        Py_ssize_t len = offs[i + 1] - offs[i];
        const char *v = src + offs[i];
        if (memchr(v, '\n', (size_t)len) != NULL || memchr(v, '\r', (size_t)len) != NULL)
            ok = 0;
        memcpy(dst + pos, v, (size_t)len);
        pos += len;
    }
    release_input(&in);
    if (!ok) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

/* ------------------------------------------------------------------ avro_flat */

#define MAX_FIELDS 256

typedef struct {
    char kind;     /* b i l f d s y */
    int nullable;  /* a union with null */
    int null_idx;  /* the null branch's index (0 or 1) */
    int width;     /* bytes per value of fixed-width kinds (booleans: 0, a bitmap) */
    /* pass 1: sizes; pass 2: cursors */
    Py_ssize_t nulls, bytes, cap;
    /* output */
    PyObject *validity_obj, *values_obj, *offsets_obj;
    uint8_t *validity;
    char *values;
    int64_t *offsets;
} Field;

/* Zig-zag varint of at most 64 bits in p[*pos, end). 0 or -1. */
static inline int read_long(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t i = *pos;
    uint64_t raw = 0;
    for (int shift = 0;; shift += 7) {
        if (i >= end)
            return -1;
        uint8_t b = p[i++];
        if (shift == 63 && b > 1)
            return -1;
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
    }
    *pos = i;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

static inline void set_bit(uint8_t *bitmap, Py_ssize_t i) { bitmap[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* One field of one value at row ``row``; 0 or -1 (not decodable here). */
static int avro_field(Field *f, const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t row,
                      int fill)
{
    if (f->nullable) {
        int64_t branch;
        if (read_long(p, end, pos, &branch) < 0 || (branch != 0 && branch != 1))
            return -1;
        if (branch == f->null_idx) {
            f->nulls++;
            if (fill && f->offsets != NULL)
                f->offsets[row + 1] = f->bytes;
            return 0;
        }
    }
    if (fill && f->validity != NULL)
        set_bit(f->validity, row);
    switch (f->kind) {
    case 'b': {
        if (*pos >= end || p[*pos] > 1)
            return -1;
        if (fill && p[*pos])
            set_bit((uint8_t *)f->values, row);
        *pos += 1;
        return 0;
    }
    case 'i':
    case 'l': {
        int64_t v;
        if (read_long(p, end, pos, &v) < 0)
            return -1;
        if (f->kind == 'i') {
            if (v < INT32_MIN || v > INT32_MAX)
                return -1;
            if (fill)
                ((int32_t *)f->values)[row] = (int32_t)v;
        } else if (fill) {
            ((int64_t *)f->values)[row] = v;
        }
        return 0;
    }
    case 'f':
    case 'd': {
        Py_ssize_t w = f->kind == 'f' ? 4 : 8;
        if (end - *pos < w)
            return -1;
        if (fill) /* Avro is little endian, as the platforms we build for */
            memcpy(f->values + row * w, p + *pos, (size_t)w);
        *pos += w;
        return 0;
    }
    default: { /* s, y */
        int64_t len;
        if (read_long(p, end, pos, &len) < 0 || len < 0 || len > end - *pos)
            return -1;
        if (fill && len > f->cap - f->bytes)
            return -1; /* the input changed since pass 1 */
        if (f->kind == 's' && !fill && !utf8_valid(p + *pos, (Py_ssize_t)len))
            return -1; /* checked in pass 1; the buffers are immutable */
        if (fill) {
            memcpy(f->values + f->bytes, p + *pos, (size_t)len);
            f->offsets[row + 1] = f->bytes + len;
        }
        f->bytes += (Py_ssize_t)len;
        *pos += (Py_ssize_t)len;
        return 0;
    }
    }
}

static int avro_pass(const BinaryInput *in, const Py_buffer *header, Field *fields, int nf, int fill)
{
    const int32_t *offs = (const int32_t *)in->offsets.buf + in->first;
    const uint8_t *data = (const uint8_t *)in->data.buf;
    for (int k = 0; k < nf; k++)
        fields[k].nulls = fields[k].bytes = 0;
    for (Py_ssize_t row = 0; row < in->n; row++) {
        if (!is_valid(in, row))
            return -1;
        Py_ssize_t pos = offs[row], end = offs[row + 1];
        if (end - pos < header->len || memcmp(data + pos, header->buf, (size_t)header->len) != 0)
            return -1;
        pos += header->len;
        for (int k = 0; k < nf; k++) {
            if (avro_field(&fields[k], data, end, &pos, row, fill) < 0)
                return -1;
        }
        if (pos != end)
            return -1;
    }
    return 0;
}

static int parse_codes(const char *codes, Py_ssize_t len, Field *fields, int *nf)
{
    int k = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        char c = codes[i];
        if (k >= MAX_FIELDS)
            return -1;
        Field *f = &fields[k];
        memset(f, 0, sizeof(*f));
        f->nullable = c >= 'A' && c <= 'Z';
        f->kind = f->nullable ? (char)(c - 'A' + 'a') : c;
        if (strchr("bilfdsy", f->kind) == NULL || f->kind == 0)
            return -1;
        if (f->nullable && i + 1 < len && codes[i + 1] == '~') {
            f->null_idx = 1;
            i++;
        }
        f->width = f->kind == 'i' || f->kind == 'f' ? 4 : f->kind == 'l' || f->kind == 'd' ? 8 : 0;
        k++;
    }
    *nf = k;
    return 0;
}

static int allocate_field(Field *f, Py_ssize_t n)
{
    if (f->nulls) {
        f->validity = (uint8_t *)new_bytes(&f->validity_obj, (n + 7) / 8, 1);
        if (f->validity == NULL)
            return -1;
    }
    if (f->kind == 'b') {
        f->values = new_bytes(&f->values_obj, (n + 7) / 8, 1);
    } else if (f->width) {
        f->values = new_bytes(&f->values_obj, n * f->width, 1); /* nulls stay 0 */
    } else {
        f->cap = f->bytes;
        f->values = new_bytes(&f->values_obj, f->bytes, 0);
        f->offsets = (int64_t *)new_bytes(&f->offsets_obj, (n + 1) * 8, 1);
        if (f->offsets == NULL)
            return -1;
    }
    return f->values == NULL ? -1 : 0;
}

static void free_fields(Field *fields, int nf)
{
    for (int k = 0; k < nf; k++) {
        Py_CLEAR(fields[k].validity_obj);
        Py_CLEAR(fields[k].values_obj);
        Py_CLEAR(fields[k].offsets_obj);
    }
}

static PyObject *field_result(Field *f)
{
    PyObject *validity = f->validity_obj ? f->validity_obj : Py_None;
    Py_INCREF(validity);
    PyObject *res;
    if (f->offsets_obj != NULL)
        res = Py_BuildValue("(NnOO)", validity, f->nulls, f->offsets_obj, f->values_obj);
    else
        res = Py_BuildValue("(NnO)", validity, f->nulls, f->values_obj);
    return res;
}

static PyObject *avro_flat(PyObject *self, PyObject *args)
{
    PyObject *validity, *offsets, *data, *result = NULL;
    Py_ssize_t n, first;
    Py_buffer header, codes;
    BinaryInput in;
    Field fields[MAX_FIELDS];
    int nf = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnny*y*", &validity, &offsets, &data, &n, &first, &header,
                          &codes))
        return NULL;
    if (parse_codes((const char *)codes.buf, codes.len, fields, &nf) < 0) {
        PyErr_SetString(PyExc_ValueError, "bad field codes");
        PyBuffer_Release(&header);
        PyBuffer_Release(&codes);
        return NULL;
    }
    if (parse_input(validity, offsets, data, n, first, &in) < 0) {
        PyBuffer_Release(&header);
        PyBuffer_Release(&codes);
        return NULL;
    }
    if (avro_pass(&in, &header, fields, nf, 0) < 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    for (int k = 0; k < nf; k++) {
        if (allocate_field(&fields[k], n) < 0)
            goto done;
    }
    if (avro_pass(&in, &header, fields, nf, 1) < 0) { /* the input changed under us */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = PyList_New(nf);
    if (result == NULL)
        goto done;
    for (int k = 0; k < nf; k++) {
        PyObject *item = field_result(&fields[k]);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, item);
    }
done:
    free_fields(fields, nf);
    release_input(&in);
    PyBuffer_Release(&header);
    PyBuffer_Release(&codes);
    return result;
}

/* ------------------------------------------------------------------ json_flat */

#define JSON_MAX_FIELDS 64
enum { K_NULL = 0, K_LONG = 1, K_DOUBLE = 2, K_BOOL = 4, K_STR = 8 };

typedef struct {
    const uint8_t *name;
    Py_ssize_t name_len;
    int kinds;            /* K_* seen (nulls not counted) */
    Py_ssize_t last_row;  /* the row that set it last: a duplicate key in one object */
    uint8_t *tags;        /* per row: K_* of its value (K_NULL: null or absent) */
    int64_t *slots;       /* per row: the long, the double's bits or the boolean */
    char *sdata;          /* strings: the rows' strings in row order (slots: end offsets) */
    Py_ssize_t slen, scap;
} JField;

typedef struct {
    JField f[JSON_MAX_FIELDS];
    int nf;
    Py_ssize_t n;
} JTable;

static void jtable_free(JTable *t)
{
    for (int k = 0; k < t->nf; k++) {
        PyMem_Free(t->f[k].tags);
        PyMem_Free(t->f[k].slots);
        PyMem_Free(t->f[k].sdata);
    }
}

static inline Py_ssize_t skip_ws(const uint8_t *p, Py_ssize_t i, Py_ssize_t end)
{
    while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i;
}

static JField *field_for(JTable *t, const uint8_t *name, Py_ssize_t len, int hint)
{
    if (hint < t->nf && t->f[hint].name_len == len && memcmp(t->f[hint].name, name, (size_t)len) == 0)
        return &t->f[hint]; /* objects usually list their fields in the same order */
    for (int k = 0; k < t->nf; k++) {
        JField *f = &t->f[k];
        if (f->name_len == len && memcmp(f->name, name, (size_t)len) == 0)
            return f;
    }
    if (t->nf >= JSON_MAX_FIELDS)
        return NULL;
    JField *f = &t->f[t->nf];
    memset(f, 0, sizeof(*f));
    f->tags = PyMem_Calloc((size_t)(t->n ? t->n : 1), 1);
    f->slots = PyMem_Calloc((size_t)(t->n ? t->n : 1), 8);
    if (f->tags == NULL || f->slots == NULL) {
        PyMem_Free(f->tags);
        PyMem_Free(f->slots);
        return NULL;
    }
    f->name = name;
    f->name_len = len;
    f->last_row = -1;
    t->nf++;
    return f;
}

static int str_reserve(JField *f, Py_ssize_t more)
{
    if (f->slen + more <= f->scap)
        return 0;
    Py_ssize_t cap = f->scap ? f->scap : 4096;
    while (cap < f->slen + more)
        cap *= 2;
    char *d = PyMem_Realloc(f->sdata, (size_t)cap);
    if (d == NULL)
        return -1;
    f->sdata = d;
    f->scap = cap;
    return 0;
}

static inline int hex4(const uint8_t *p, Py_ssize_t i, Py_ssize_t end, uint32_t *out)
{
    if (end - i < 4)
        return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = p[i + k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A string at p[*pos] (after the opening quote) appended to out's data, or only checked
 * when out is NULL (a key: no escapes allowed). *pos ends past the closing quote. */
static int json_string(const uint8_t *p, Py_ssize_t *pos, Py_ssize_t end, JField *out)
{
    Py_ssize_t i = *pos;
    for (;;) {
        Py_ssize_t run = i;
        int ascii = 1;
        while (end - i >= 8) { /* 8 bytes at a time while plain ASCII */
            uint64_t w;
            memcpy(&w, p + i, 8);
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t special = (w - ones * 0x20) | ((q - ones) & ~q) | ((b - ones) & ~b) | w;
            if (special & high)
                break; /* a quote, backslash, control or non-ASCII byte (or a false alarm) */
            i += 8;
        }
        while (i < end && p[i] != '"' && p[i] != '\\' && p[i] >= 0x20) {
            ascii &= p[i] < 0x80;
            i++;
        }
        if (i >= end || p[i] < 0x20)
            return -1; /* unterminated, or a raw control character */
        if (!ascii && !utf8_valid(p + run, i - run))
            return -1;
        if (out != NULL && i > run) {
            if (str_reserve(out, i - run) < 0)
                return -1;
            memcpy(out->sdata + out->slen, p + run, (size_t)(i - run));
            out->slen += i - run;
        }
        if (p[i] == '"') {
            *pos = i + 1;
            return 0;
        }
        if (out == NULL || i + 1 >= end)
            return -1; /* an escape in a key: the exact path decides */
        uint8_t e = p[i + 1];
        char c;
        i += 2;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, i, end, &cp) < 0)
                return -1;
            i += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return -1; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (end - i < 6 || p[i] != '\\' || p[i + 1] != 'u' || hex4(p, i + 2, end, &lo) < 0 ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return -1; /* a lone high surrogate */
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            uint8_t buf[4];
            int len;
            if (cp < 0x80) {
                buf[0] = (uint8_t)cp;
                len = 1;
            } else if (cp < 0x800) {
                buf[0] = (uint8_t)(0xC0 | (cp >> 6));
                buf[1] = (uint8_t)(0x80 | (cp & 0x3F));
                len = 2;
            } else if (cp < 0x10000) {
                buf[0] = (uint8_t)(0xE0 | (cp >> 12));
                buf[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                buf[2] = (uint8_t)(0x80 | (cp & 0x3F));
                len = 3;
            } else {
                buf[0] = (uint8_t)(0xF0 | (cp >> 18));
                buf[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                buf[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                buf[3] = (uint8_t)(0x80 | (cp & 0x3F));
                len = 4;
            }
            if (str_reserve(out, len) < 0)
                return -1;
            memcpy(out->sdata + out->slen, buf, (size_t)len);
            out->slen += len;
            continue;
        }
        default:
            return -1;
        }
        if (str_reserve(out, 1) < 0)
            return -1;
        out->sdata[out->slen++] = c;
    }
}

/* A number at p[*pos]: a long (fits 64 bits, no fraction or exponent) or a finite
 * double (strtod: correctly rounded, as Python's float()). 0 or -1. */
static int json_number(const uint8_t *p, Py_ssize_t *pos, Py_ssize_t end, int *kind, int64_t *slot)
{
    Py_ssize_t i = *pos, start = i;
    int neg = 0, is_float = 0;
    if (i < end && p[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= end || p[i] < '0' || p[i] > '9')
        return -1;
    if (p[i] == '0') {
        i++;
        if (i < end && p[i] >= '0' && p[i] <= '9')
            return -1; /* a leading zero */
    } else {
        while (i < end && p[i] >= '0' && p[i] <= '9')
            i++;
    }
    Py_ssize_t int_end = i;
    if (i < end && p[i] == '.') {
        is_float = 1;
        i++;
        if (i >= end || p[i] < '0' || p[i] > '9')
            return -1;
        while (i < end && p[i] >= '0' && p[i] <= '9')
            i++;
    }
    if (i < end && (p[i] == 'e' || p[i] == 'E')) {
        is_float = 1;
        i++;
        if (i < end && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= end || p[i] < '0' || p[i] > '9')
            return -1;
        while (i < end && p[i] >= '0' && p[i] <= '9')
            i++;
    }
    if (!is_float) {
        uint64_t v = 0;
        for (Py_ssize_t k = start + neg; k < int_end; k++) {
            uint64_t d = (uint64_t)(p[k] - '0');
            if (v > (UINT64_MAX - d) / 10)
                return -1;
            v = v * 10 + d;
        }
        if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX)
            return -1; /* past 64 bits: the exact path decides */
        *slot = neg ? (int64_t)(0 - v) : (int64_t)v;
        *kind = K_LONG;
    } else {
        char buf[64];
        if (i - start >= (Py_ssize_t)sizeof(buf))
            return -1;
        memcpy(buf, p + start, (size_t)(i - start));
        buf[i - start] = 0;
        double d = strtod(buf, NULL);
        if (!(d - d == 0))
            return -1; /* inf: the exact path decides */
        memcpy(slot, &d, 8);
        *kind = K_DOUBLE;
    }
    *pos = i;
    return 0;
}

static int json_value(JTable *t, const uint8_t *p, Py_ssize_t end, Py_ssize_t row)
{
    Py_ssize_t i = skip_ws(p, 0, end);
    int nth = 0;
    if (i >= end || p[i] != '{')
        return -1;
    i = skip_ws(p, i + 1, end);
    if (i < end && p[i] == '}') {
        i = skip_ws(p, i + 1, end);
        return i == end ? 0 : -1;
    }
    for (;;) {
        if (i >= end || p[i] != '"')
            return -1;
        Py_ssize_t kstart = i + 1;
        i = kstart;
        if (json_string(p, &i, end, NULL) < 0)
            return -1;
        JField *f = field_for(t, p + kstart, i - 1 - kstart, nth++);
        if (f == NULL || f->last_row == row)
            return -1; /* too many fields, no memory, or a duplicate key */
        f->last_row = row;
        i = skip_ws(p, i, end);
        if (i >= end || p[i] != ':')
            return -1;
        i = skip_ws(p, i + 1, end);
        if (i >= end)
            return -1;
        uint8_t c = p[i];
        int kind = K_NULL;
        int64_t slot = 0;
        if (c == '"') {
            i++;
            if (json_string(p, &i, end, f) < 0)
                return -1;
            kind = K_STR;
        } else if (c == 't' && end - i >= 4 && memcmp(p + i, "true", 4) == 0) {
            kind = K_BOOL, slot = 1, i += 4;
        } else if (c == 'f' && end - i >= 5 && memcmp(p + i, "false", 5) == 0) {
            kind = K_BOOL, slot = 0, i += 5;
        } else if (c == 'n' && end - i >= 4 && memcmp(p + i, "null", 4) == 0) {
            i += 4;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (json_number(p, &i, end, &kind, &slot) < 0)
                return -1;
        } else {
            return -1; /* nested objects and arrays: the exact path keeps their text */
        }
        f->tags[row] = (uint8_t)kind;
        f->slots[row] = slot;
        f->kinds |= kind;
        i = skip_ws(p, i, end);
        if (i < end && p[i] == ',') {
            i = skip_ws(p, i + 1, end);
            continue;
        }
        if (i < end && p[i] == '}') {
            i = skip_ws(p, i + 1, end);
            return i == end ? 0 : -1;
        }
        return -1;
    }
}

static PyObject *json_column(JField *f, Py_ssize_t n)
{
    Py_ssize_t nulls = 0;
    for (Py_ssize_t r = 0; r < n; r++)
        nulls += f->tags[r] == K_NULL;
    PyObject *validity = Py_None;
    Py_INCREF(validity);
    if (nulls) {
        Py_DECREF(validity);
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (validity == NULL)
            return NULL;
        uint8_t *bm = (uint8_t *)PyBytes_AS_STRING(validity);
        memset(bm, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t r = 0; r < n; r++)
            if (f->tags[r] != K_NULL)
                set_bit(bm, r);
    }
    PyObject *name = PyBytes_FromStringAndSize((const char *)f->name, f->name_len);
    PyObject *res = NULL;
    if (name == NULL)
        goto done;
    if (f->kinds == K_BOOL) {
        PyObject *bits = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (bits == NULL)
            goto done;
        uint8_t *bm = (uint8_t *)PyBytes_AS_STRING(bits);
        memset(bm, 0, (size_t)(n + 7) / 8);
        for (Py_ssize_t r = 0; r < n; r++)
            if (f->slots[r])
                set_bit(bm, r);
        res = Py_BuildValue("(OsOnN)", name, "boolean", validity, nulls, bits);
    } else if (f->kinds == K_STR) {
        /* rebuild offsets: the data holds the rows' strings in row order */
        PyObject *offs = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
        PyObject *data = PyBytes_FromStringAndSize(f->sdata ? f->sdata : "", f->slen);
        if (offs == NULL || data == NULL) {
            Py_XDECREF(offs);
            Py_XDECREF(data);
            goto done;
        }
        int64_t *o = (int64_t *)PyBytes_AS_STRING(offs);
        o[0] = 0;
        for (Py_ssize_t r = 0; r < n; r++)
            o[r + 1] = f->tags[r] == K_STR ? f->slots[r] : o[r];
        res = Py_BuildValue("(OsOnNN)", name, "string", validity, nulls, offs, data);
    } else {
        const char *kind = f->kinds == K_LONG ? "long" : "double";
        if (f->kinds != K_LONG) { /* longs widen to doubles, as Python's float(int) */
            for (Py_ssize_t r = 0; r < n; r++) {
                if (f->tags[r] == K_LONG) {
                    double d = (double)f->slots[r];
                    memcpy(&f->slots[r], &d, 8);
                }
            }
        }
        PyObject *vals = PyBytes_FromStringAndSize((const char *)f->slots, n * 8);
        if (vals == NULL)
            goto done;
        res = Py_BuildValue("(OsOnN)", name, kind, validity, nulls, vals);
    }
done:
    Py_XDECREF(name);
    Py_DECREF(validity);
    return res;
}

static PyObject *json_flat(PyObject *self, PyObject *args)
{
    PyObject *validity, *offsets, *data, *result = NULL;
    Py_ssize_t n, first;
    BinaryInput in;
    JTable t;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnn", &validity, &offsets, &data, &n, &first))
        return NULL;
    if (parse_input(validity, offsets, data, n, first, &in) < 0)
        return NULL;
    memset(&t, 0, sizeof(t));
    t.n = n;
    const int32_t *offs = (const int32_t *)in.offsets.buf + first;
    const uint8_t *src = (const uint8_t *)in.data.buf;
    int ok = 1;
    for (Py_ssize_t row = 0; row < n && ok; row++) {
        if (!is_valid(&in, row))
            continue; /* a tombstone: every column null */
        if (json_value(&t, src + offs[row], offs[row + 1] - offs[row], row) < 0) {
            ok = 0;
            break;
        }
        for (int k = 0; k < t.nf; k++) { /* a string's end offset, kept in its slot */
            JField *f = &t.f[k];
            if (f->tags[row] == K_STR)
                f->slots[row] = f->slen;
        }
    }
    for (int k = 0; k < t.nf && ok; k++) {
        int kinds = t.f[k].kinds;
        if (kinds & K_STR && kinds != K_STR)
            ok = 0; /* a string and something else: a conflict, the exact path reports it */
        if (kinds & K_BOOL && kinds != K_BOOL)
            ok = 0;
    }
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    for (int k = 0; k < t.nf; k++) {
        if (t.f[k].kinds == K_NULL)
            continue; /* only ever null: not a column */
        PyObject *col = json_column(&t.f[k], n);
        if (col == NULL || PyList_Append(result, col) < 0) {
            Py_XDECREF(col);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(col);
    }
done:
    jtable_free(&t);
    release_input(&in);
    return result;
}

PyDoc_STRVAR(join_lines_doc,
"join_lines(validity, offsets, data, n, first) -> bytes | None\n\n"
"The values of an Arrow binary array joined by '\\n' (a null as \"{}\"); None when a\n"
"value holds '\\n' or '\\r'.");

PyDoc_STRVAR(avro_flat_doc,
"avro_flat(validity, offsets, data, n, first, header, codes) -> list | None\n\n"
"Confluent-wire Avro values of one flat record schema decoded into Arrow buffers, one\n"
"entry per field code (see the module source); None when any value does not fit.");

PyDoc_STRVAR(json_flat_doc,
"json_flat(validity, offsets, data, n, first) -> list | None\n\n"
"JSON objects of flat fields parsed into Arrow buffers: per field with a value,\n"
"(name, kind, validity or None, null count, values) or for strings (..., int64 offsets,\n"
"data); None when any value is not such an object or a field mixes kinds.");

static PyMethodDef methods[] = {
    {"join_lines", join_lines, METH_VARARGS, join_lines_doc},
    {"json_flat", json_flat, METH_VARARGS, json_flat_doc},
    {"avro_flat", avro_flat, METH_VARARGS, avro_flat_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ingest_job._columnar",
    "Column-at-a-time helpers of the ingest job (see ingest_job/columnar.py).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columnar(void) { return PyModuleDef_Init(&module); }
