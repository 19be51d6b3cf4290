/*
 * Native decoder for the records section of Kafka v2 record batches.
 *
 * decode(batches, start, end, strict_utf8) walks the (already decompressed) records of
 * many batches and returns Arrow-ready buffers: int64 offsets and timestamps (ms), int32
 * timestamp types, key and value as (validity bitmap, int32 offsets, data), and headers as
 * int32 list offsets into flat header key (string) and header value (binary) columns.
 *
 * Two passes over the same input: the first validates every record and sizes the output,
 * the second fills exactly sized bytes objects. Every read is bounds-checked against the
 * record's own length; malformed input raises CorruptRecords (a ValueError), a column past
 * 2 GiB raises OverflowError. Only the CPython C API is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *CorruptRecords;

typedef struct {
    Py_buffer view;
    int64_t base_offset;
    int64_t base_ts;
    int64_t max_ts;
    int log_append_time;
    int32_t count;
} Batch;

typedef struct {
    /* sizes: counted by pass 1, used as cursors by pass 2 */
    Py_ssize_t nrec, kbytes, vbytes, nhdr, hkbytes, hvbytes;
    Py_ssize_t knulls, vnulls, hvnulls;
    /* pass 1's sizes, the capacities pass 2 must stay within */
    Py_ssize_t cap_n, cap_k, cap_v, cap_h, cap_hk, cap_hv;
    int fill;
    int strict;
    int64_t start, end;
    /* output (pass 2) */
    int64_t *offsets, *ts;
    int32_t *ts_types;
    uint8_t *kvalid, *vvalid, *hvvalid;
    int32_t *koffs, *voffs, *hoffs, *hkoffs, *hvoffs;
    char *kdata, *vdata, *hkdata, *hvdata;
} Out;

/* Error codes: a static message per failure, turned into CorruptRecords by the caller. */
static const char *err_msg;

#define FAIL(msg)        \
    do {                 \
        err_msg = (msg); \
        return -1;       \
    } while (0)

/* Zig-zag varint (at most 64 bits) in p[*pos, limit). */
static inline int read_varint(const uint8_t *p, Py_ssize_t limit, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t i = *pos;
    uint64_t raw;
    if (i < limit && p[i] < 0x80) { /* one byte: the common case */
        raw = p[i];
        *pos = i + 1;
        *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        return 0;
    }
    raw = 0;
    for (int shift = 0;; shift += 7) {
        if (i >= limit)
            FAIL("truncated varint");
        uint8_t b = p[i++];
        if (shift == 63 && b > 1)
            FAIL("varint too long");
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
    }
    *pos = i;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

#include "native_common.h"

/* Bytes of an invalid header key with each bad sequence replaced by U+FFFD (lenient
 * mode), as a new bytes object: Python's own "replace" handler keeps the result identical
 * to bytes.decode("utf-8", "replace"). */
static PyObject *replaced_utf8(const uint8_t *s, Py_ssize_t n)
{
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, "replace");
    if (text == NULL)
        return NULL;
    PyObject *out = PyUnicode_AsUTF8String(text);
    Py_DECREF(text);
    return out;
}

static inline void set_bit(uint8_t *bitmap, Py_ssize_t i) { bitmap[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* A nullable byte field (key, value, header value): length varint then bytes. */
static int read_bytes_field(const uint8_t *p, Py_ssize_t rec_end, Py_ssize_t *pos, int64_t *len,
                            const char *neg_msg)
{
    if (read_varint(p, rec_end, pos, len) < 0)
        return -1;
    if (*len < -1)
        FAIL(neg_msg);
    if (*len > rec_end - *pos)
        FAIL("field length past the end of its record");
    return 0;
}

static int headers(Out *o, const uint8_t *p, Py_ssize_t rec_end, Py_ssize_t *pos, int emit)
{
    int64_t count;
    if (read_varint(p, rec_end, pos, &count) < 0)
        return -1;
    if (count < 0)
        FAIL("negative header count");
    if (count > (rec_end - *pos) / 2)
        FAIL("header count past the end of its record");
    for (int64_t h = 0; h < count; h++) {
        int64_t klen, vlen;
        if (read_varint(p, rec_end, pos, &klen) < 0)
            return -1;
        if (klen < 0)
            FAIL("negative header key length");
        if (klen > rec_end - *pos)
            FAIL("header key past the end of its record");
        const uint8_t *key = p + *pos;
        *pos += (Py_ssize_t)klen;
        if (read_bytes_field(p, rec_end, pos, &vlen, "negative header value length") < 0)
            return -1;
        const uint8_t *val = p + *pos;
        if (vlen > 0)
            *pos += (Py_ssize_t)vlen;
        int valid = utf8_valid(key, (Py_ssize_t)klen);
        if (!valid && o->strict)
            FAIL("header key is not valid UTF-8");
        if (!emit)
            continue;
        Py_ssize_t klen_out = (Py_ssize_t)klen;
        PyObject *fixed = NULL;
        if (!valid) {
            fixed = replaced_utf8(key, (Py_ssize_t)klen);
            if (fixed == NULL) {
                err_msg = NULL; /* a Python exception is set */
                return -1;
            }
            key = (const uint8_t *)PyBytes_AS_STRING(fixed);
            klen_out = PyBytes_GET_SIZE(fixed);
        }
        if (o->fill) {
            if (o->nhdr >= o->cap_h || klen_out > o->cap_hk - o->hkbytes ||
                (vlen > 0 && vlen > o->cap_hv - o->hvbytes)) {
                Py_XDECREF(fixed);
                FAIL("records changed while being decoded");
            }
            memcpy(o->hkdata + o->hkbytes, key, (size_t)klen_out);
            o->hkoffs[o->nhdr + 1] = (int32_t)(o->hkbytes + klen_out);
            if (vlen >= 0) {
                memcpy(o->hvdata + o->hvbytes, val, (size_t)vlen);
                set_bit(o->hvvalid, o->nhdr);
            }
            o->hvoffs[o->nhdr + 1] = (int32_t)(o->hvbytes + (vlen > 0 ? vlen : 0));
        }
        Py_XDECREF(fixed);
        o->hkbytes += klen_out;
        if (vlen >= 0)
            o->hvbytes += (Py_ssize_t)vlen;
        else
            o->hvnulls++;
        o->nhdr++;
    }
    return 0;
}

static int one_record(Out *o, const Batch *b, const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos)
{
    int64_t len, ts_delta, off_delta, klen, vlen, offset, ts;
    if (read_varint(p, n, pos, &len) < 0)
        return -1;
    if (len < 1 || len > n - *pos)
        FAIL("record length out of bounds");
    Py_ssize_t rec_end = *pos + (Py_ssize_t)len;
    *pos += 1; /* attributes (unused) */
    if (read_varint(p, rec_end, pos, &ts_delta) < 0 || read_varint(p, rec_end, pos, &off_delta) < 0)
        return -1;
    if (__builtin_add_overflow(b->base_offset, off_delta, &offset))
        FAIL("record offset out of the 64-bit range");
    if (b->log_append_time)
        ts = b->max_ts;
    else if (__builtin_add_overflow(b->base_ts, ts_delta, &ts))
        FAIL("record timestamp out of the 64-bit range");
    if (read_bytes_field(p, rec_end, pos, &klen, "negative key length") < 0)
        return -1;
    const uint8_t *key = p + *pos;
    if (klen > 0)
        *pos += (Py_ssize_t)klen;
    if (read_bytes_field(p, rec_end, pos, &vlen, "negative value length") < 0)
        return -1;
    const uint8_t *val = p + *pos;
    if (vlen > 0)
        *pos += (Py_ssize_t)vlen;
    int emit = offset >= o->start && offset < o->end;
    if (emit && o->fill) {
        Py_ssize_t i = o->nrec;
        if (i >= o->cap_n || (klen > 0 && klen > o->cap_k - o->kbytes) ||
            (vlen > 0 && vlen > o->cap_v - o->vbytes))
            FAIL("records changed while being decoded");
        o->offsets[i] = offset;
        o->ts[i] = ts;
        o->ts_types[i] = b->log_append_time;
        if (klen >= 0) {
            memcpy(o->kdata + o->kbytes, key, (size_t)klen);
            set_bit(o->kvalid, i);
        }
        o->koffs[i + 1] = (int32_t)(o->kbytes + (klen > 0 ? klen : 0));
        if (vlen >= 0) {
            memcpy(o->vdata + o->vbytes, val, (size_t)vlen);
            set_bit(o->vvalid, i);
        }
        o->voffs[i + 1] = (int32_t)(o->vbytes + (vlen > 0 ? vlen : 0));
    }
    if (*pos < rec_end && p[*pos] == 0) {
        *pos += 1; /* no headers: the common case */
    } else if (headers(o, p, rec_end, pos, emit) < 0) {
        return -1;
    }
    if (*pos != rec_end)
        FAIL("record length does not match its fields");
    if (emit) {
        if (o->fill)
            o->hoffs[o->nrec + 1] = (int32_t)o->nhdr;
        o->kbytes += klen > 0 ? klen : 0;
        o->vbytes += vlen > 0 ? vlen : 0;
        o->knulls += klen < 0;
        o->vnulls += vlen < 0;
        o->nrec++;
    }
    return 0;
}

static int one_pass(Out *o, Batch *batches, Py_ssize_t nb)
{
    o->nrec = o->kbytes = o->vbytes = o->nhdr = o->hkbytes = o->hvbytes = 0;
    o->knulls = o->vnulls = o->hvnulls = 0;
    for (Py_ssize_t bi = 0; bi < nb; bi++) {
        const Batch *b = &batches[bi];
        const uint8_t *p = (const uint8_t *)b->view.buf;
        Py_ssize_t n = b->view.len, pos = 0;
        if (b->count < 0)
            FAIL("negative record count");
        for (int32_t r = 0; r < b->count; r++) {
            if (one_record(o, b, p, n, &pos) < 0)
                return -1;
        }
        if (pos != n)
            FAIL("trailing bytes after the last record");
        if (o->kbytes > INT32_MAX || o->vbytes > INT32_MAX || o->hkbytes > INT32_MAX ||
            o->hvbytes > INT32_MAX || o->nhdr > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "decoded column larger than 2 GiB");
            err_msg = NULL;
            return -1;
        }
    }
    return 0;
}

enum { O_OFFS, O_TS, O_TST, O_KV, O_KO, O_KD, O_VV, O_VO, O_VD, O_HO, O_HKO, O_HKD, O_HVV,
       O_HVO, O_HVD, O_COUNT };

static int allocate(Out *o, PyObject **objs)
{
    Py_ssize_t n = o->nrec, h = o->nhdr;
    o->offsets = (int64_t *)new_bytes(&objs[O_OFFS], n * 8, 0);
    o->ts = (int64_t *)new_bytes(&objs[O_TS], n * 8, 0);
    o->ts_types = (int32_t *)new_bytes(&objs[O_TST], n * 4, 0);
    o->kvalid = (uint8_t *)new_bytes(&objs[O_KV], (n + 7) / 8, 1);
    o->koffs = (int32_t *)new_bytes(&objs[O_KO], (n + 1) * 4, 1);
    o->kdata = new_bytes(&objs[O_KD], o->kbytes, 0);
    o->vvalid = (uint8_t *)new_bytes(&objs[O_VV], (n + 7) / 8, 1);
    o->voffs = (int32_t *)new_bytes(&objs[O_VO], (n + 1) * 4, 1);
    o->vdata = new_bytes(&objs[O_VD], o->vbytes, 0);
    o->hoffs = (int32_t *)new_bytes(&objs[O_HO], (n + 1) * 4, 1);
    o->hkoffs = (int32_t *)new_bytes(&objs[O_HKO], (h + 1) * 4, 1);
    o->hkdata = new_bytes(&objs[O_HKD], o->hkbytes, 0);
    o->hvvalid = (uint8_t *)new_bytes(&objs[O_HVV], (h + 7) / 8, 1);
    o->hvoffs = (int32_t *)new_bytes(&objs[O_HVO], (h + 1) * 4, 1);
    o->hvdata = new_bytes(&objs[O_HVD], o->hvbytes, 0);
    for (int i = 0; i < O_COUNT; i++) {
        if (objs[i] == NULL)
            return -1;
    }
    return 0;
}

static int parse_batches(PyObject *seq, Batch **out, Py_ssize_t *nout)
{
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
    Batch *batches = PyMem_Calloc(nb ? (size_t)nb : 1, sizeof(Batch));
    if (batches == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = batches;
    *nout = 0;
    for (Py_ssize_t i = 0; i < nb; i++) {
        Batch *b = &batches[i];
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "each batch must be a tuple");
            return -1;
        }
        if (!PyArg_ParseTuple(item, "y*LLLii;batch (records, base_offset, base_timestamp, "
                                    "max_timestamp, log_append_time, record_count)",
                              &b->view, &b->base_offset, &b->base_ts, &b->max_ts,
                              &b->log_append_time, &b->count))
            return -1;
        *nout = i + 1;
    }
    return 0;
}

static PyObject *build_result(Out *o, PyObject **objs)
{
    PyObject *res = Py_BuildValue(
        "(nNNNNNNnNNNnNNNNNNnn)", o->nrec, objs[O_OFFS], objs[O_TS], objs[O_TST], objs[O_KV],
        objs[O_KO], objs[O_KD], o->knulls, objs[O_VV], objs[O_VO], objs[O_VD], o->vnulls,
        objs[O_HO], objs[O_HKO], objs[O_HKD], objs[O_HVV], objs[O_HVO], objs[O_HVD],
        o->nhdr, o->hvnulls);
    for (int i = 0; i < O_COUNT; i++)
        objs[i] = NULL; /* "N" stole them (also on failure) */
    return res;
}

PyDoc_STRVAR(decode_doc,
"decode(batches, start, end, strict_utf8) -> tuple\n\n"
"batches: sequence of (records, base_offset, base_timestamp, max_timestamp,\n"
"log_append_time, record_count) with records the decompressed records section.\n"
"Records with start <= offset < end are emitted (all are validated). Returns\n"
"(n, offsets, timestamps, timestamp_types, key_validity, key_offsets, key_data, key_nulls,\n"
" value_validity, value_offsets, value_data, value_nulls, header_offsets,\n"
" header_key_offsets, header_key_data, header_value_validity, header_value_offsets,\n"
" header_value_data, header_count, header_value_nulls).");

static PyObject *decode(PyObject *self, PyObject *args)
{
    PyObject *arg, *seq, *result = NULL;
    Out o;
    Batch *batches = NULL;
    Py_ssize_t nb = 0;
    PyObject *objs[O_COUNT] = {NULL};
    (void)self;
    memset(&o, 0, sizeof(o));
    if (!PyArg_ParseTuple(args, "OLLp", &arg, &o.start, &o.end, &o.strict))
        return NULL;
    seq = PySequence_Fast(arg, "batches must be a sequence");
    if (seq == NULL)
        return NULL;
    if (parse_batches(seq, &batches, &nb) < 0)
        goto done;
    err_msg = NULL;
    if (one_pass(&o, batches, nb) < 0)
        goto fail;
    if (allocate(&o, objs) < 0)
        goto done;
    o.cap_n = o.nrec, o.cap_k = o.kbytes, o.cap_v = o.vbytes;
    o.cap_h = o.nhdr, o.cap_hk = o.hkbytes, o.cap_hv = o.hvbytes;
    o.fill = 1;
    if (one_pass(&o, batches, nb) < 0)
        goto fail; /* input changed under us (a shared mutable buffer) */
    result = build_result(&o, objs);
    goto done;
fail:
    if (err_msg != NULL)
        PyErr_SetString(CorruptRecords, err_msg);
done:
    for (int i = 0; i < O_COUNT; i++)
        Py_XDECREF(objs[i]);
    for (Py_ssize_t i = 0; i < nb; i++)
        PyBuffer_Release(&batches[i].view);
    PyMem_Free(batches);
    Py_DECREF(seq);
    return result;
}

/* One record of a records section being checked (scan): its offset delta must be
 * ``index`` (records are numbered 0..count-1 within their batch) and its fields must fill
 * its length exactly. Returns the timestamp delta in *ts_delta. */
static int scan_record(Out *o, const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, int32_t index,
                       int64_t *ts_delta)
{
    int64_t len, off_delta, klen, vlen;
    if (read_varint(p, n, pos, &len) < 0)
        return -1;
    if (len < 1 || len > n - *pos)
        FAIL("record length out of bounds");
    Py_ssize_t rec_end = *pos + (Py_ssize_t)len;
    *pos += 1; /* attributes (unused) */
    if (read_varint(p, rec_end, pos, ts_delta) < 0 || read_varint(p, rec_end, pos, &off_delta) < 0)
        return -1;
    if (off_delta != index)
        FAIL("record offset delta does not match its position in the batch");
    if (read_bytes_field(p, rec_end, pos, &klen, "negative key length") < 0)
        return -1;
    if (klen > 0)
        *pos += (Py_ssize_t)klen;
    if (read_bytes_field(p, rec_end, pos, &vlen, "negative value length") < 0)
        return -1;
    if (vlen > 0)
        *pos += (Py_ssize_t)vlen;
    if (*pos < rec_end && p[*pos] == 0) {
        *pos += 1;
    } else if (headers(o, p, rec_end, pos, 0) < 0) {
        return -1;
    }
    if (*pos != rec_end)
        FAIL("record length does not match its fields");
    return 0;
}

PyDoc_STRVAR(scan_doc,
"scan(records, count) -> (min_timestamp_delta, max_timestamp_delta)\n\n"
"Check that the (decompressed) records section holds exactly ``count`` well-formed\n"
"records whose offset deltas are 0..count-1, with no trailing bytes. Raises\n"
"CorruptRecords(message, record_index) otherwise. Nothing is copied.");

static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int count;
    Out o;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*i", &view, &count))
        return NULL;
    memset(&o, 0, sizeof(o));
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, pos = 0;
    int64_t lo = INT64_MAX, hi = INT64_MIN, ts_delta = 0;
    int32_t r = 0;
    err_msg = NULL;
    if (count <= 0) {
        err_msg = "record count must be positive";
        goto fail;
    }
    for (; r < count; r++) {
        if (pos >= n) {
            err_msg = "fewer records than the batch header's record count";
            goto fail;
        }
        if (scan_record(&o, p, n, &pos, r, &ts_delta) < 0)
            goto fail;
        if (ts_delta < lo)
            lo = ts_delta;
        if (ts_delta > hi)
            hi = ts_delta;
    }
    if (pos != n) {
        err_msg = "more record bytes than the batch header's record count";
        r = count;
        goto fail;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
fail:
    PyBuffer_Release(&view);
    if (err_msg != NULL) {
        PyObject *exc = Py_BuildValue("(si)", err_msg, (int)r);
        if (exc != NULL) {
            PyErr_SetObject(CorruptRecords, exc);
            Py_DECREF(exc);
        }
    }
    return NULL;
}

/* CRC-32C combination (protocol/crc32c_combine.py): crc(A + B) from crc(A), crc(B) and
 * len(B), as zlib's crc32_combine for the Castagnoli polynomial (reflected 0x82F63B78). */
#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return p;
}

static uint32_t crc32c_x2n[66]; /* x^(2^k) mod P: k = 3 + a bit of a length < 2^63 */

static void crc32c_init_powers(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    for (int k = 0; k < 66; k++) {
        crc32c_x2n[k] = p;
        p = crc32c_multmodp(p, p);
    }
}

PyDoc_STRVAR(crc32c_combine_doc,
             "crc32c_combine(crc1, crc2, len2, /) -> int\n\n"
             "The CRC-32C of A + B from crc1 = crc32c(A), crc2 = crc32c(B), len2 = len(B).");

static PyObject *crc32c_combine(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long crc1, crc2;
    long long len2;
    if (!PyArg_ParseTuple(args, "kkL:crc32c_combine", &crc1, &crc2, &len2))
        return NULL;
    if (len2 < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length");
        return NULL;
    }
    uint32_t p = 1u << 31; /* x^0 */
    uint64_t n = (uint64_t)len2;
    for (int k = 3; n; n >>= 1, k++) /* bit k of 8 * len2 */
        if (n & 1)
            p = crc32c_multmodp(crc32c_x2n[k], p);
    uint32_t out = crc32c_multmodp(p, (uint32_t)crc1) ^ (uint32_t)crc2;
    return PyLong_FromUnsignedLong(out);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"scan", scan, METH_VARARGS, scan_doc},
    {"crc32c_combine", crc32c_combine, METH_VARARGS, crc32c_combine_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m)
{
    crc32c_init_powers();
    CorruptRecords = PyErr_NewExceptionWithDoc(
        "protocol._fastrecords.CorruptRecords", "Malformed records section.",
        PyExc_ValueError, NULL);
    if (CorruptRecords == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "CorruptRecords", CorruptRecords) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocol._fastrecords",
    "Native decoder for Kafka v2 records sections (see protocol/fastrecords.py).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastrecords(void) { return PyModuleDef_Init(&module); }
