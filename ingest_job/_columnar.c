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
 * value. Every read is bounds-checked. Only the CPython C API is used.
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

/* Strict UTF-8 (as Python's decoder: no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n)
                return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            if (c == 0xE0 && c1 < 0xA0)
                return 0; /* overlong */
            if (c == 0xED && c1 >= 0xA0)
                return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n)
                return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && c1 < 0x90)
                return 0; /* overlong */
            if (c == 0xF4 && c1 >= 0x90)
                return 0; /* > U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

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
        if (f->kind == 's' && !utf8_valid(p + *pos, (Py_ssize_t)len))
            return -1;
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

static char *new_bytes(PyObject **slot, Py_ssize_t size, int zero)
{
    *slot = PyBytes_FromStringAndSize(NULL, size);
    if (*slot == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(*slot);
    if (zero)
        memset(p, 0, (size_t)size);
    return p;
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

PyDoc_STRVAR(join_lines_doc,
"join_lines(validity, offsets, data, n, first) -> bytes | None\n\n"
"The values of an Arrow binary array joined by '\\n' (a null as \"{}\"); None when a\n"
"value holds '\\n' or '\\r'.");

PyDoc_STRVAR(avro_flat_doc,
"avro_flat(validity, offsets, data, n, first, header, codes) -> list | None\n\n"
"Confluent-wire Avro values of one flat record schema decoded into Arrow buffers, one\n"
"entry per field code (see the module source); None when any value does not fit.");

static PyMethodDef methods[] = {
    {"join_lines", join_lines, METH_VARARGS, join_lines_doc},
    {"avro_flat", avro_flat, METH_VARARGS, avro_flat_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ingest_job._columnar",
    "Column-at-a-time helpers of the ingest job (see ingest_job/columnar.py).",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columnar(void) { return PyModuleDef_Init(&module); }
