/* Helpers shared by the native modules (protocol/_fastrecords.c, ingest_job/_columnar.c).
 * Include after <Python.h>. */
#ifndef KAFSCALE_NATIVE_COMMON_H
#define KAFSCALE_NATIVE_COMMON_H

#include <stdint.h>
#include <string.h>

/* Strict UTF-8 (as Python's decoder: no overlongs, no surrogates, <= U+10FFFF); ASCII
 * is skipped 8 bytes at a time. */
static inline int utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (n - i >= 8) { /* ASCII 8 bytes at a time */
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL)
            break;
        i += 8;
    }
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

/* A new bytes object of ``size`` bytes in ``*slot`` (zeroed if ``zero``): its buffer, or
 * NULL with a Python error set. */
static inline char *new_bytes(PyObject **slot, Py_ssize_t size, int zero)
{
    *slot = PyBytes_FromStringAndSize(NULL, size);
    if (*slot == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(*slot);
    if (zero)
        memset(p, 0, (size_t)size);
    return p;
}

#endif
