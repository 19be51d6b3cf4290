/*
 * The local store's batch PUT without the GIL (segments/local_batch.py).
 *
 * A batch of ~100 objects costs ~8 system calls per object. Made from Python, a thread
 * takes the GIL back after each one, and while the event loop is busy every take can
 * wait out the interpreter's switch interval: the batch's latency then grows with the
 * loop's load, not with the disk. Here each phase is one call that releases the GIL for
 * all its objects:
 *
 *   write_new(paths, buffers, etags) -> list: per object, a new file (O_EXCL) holding
 *       the buffer, its ETag recorded in the xattr user.kafscale.etag as
 *       "<etag> <mtime_ns> <size>" (as segments/local_files.py writes it; a file system
 *       without xattrs is not an error), and (fd, dev, ino, mtime_ns, size); or, when it
 *       cannot be written, the errno as a positive int (the file then removed).
 *   link_all(sources, targets) -> list of errno (0: linked; EEXIST: the name exists).
 *   close_all(fds, unlink_paths, drop_cache): per object posix_fadvise(DONTNEED) when
 *       asked, close, and unlink of its temp name (ENOENT ignored).
 *
 * Paths are bytes (os.fsencode). Nothing here makes anything durable: the caller's
 * barriers do (syncfs).
 *
 * And one copy that the interpreter will not make without the GIL:
 *
 *   join(buffers) -> bytes: the buffers' bytes, one after the other. b"".join holds the
 *       GIL while it copies unless every item is a bytes object, and a segment's pieces
 *       are memoryviews (of request frames, of the segments a merge reads): 16 MiB took
 *       ~8 ms during which the event loop could not run (docs/benchmarks.md, "Round
 *       20"). Here the buffers are exported (which pins them) and copied without it; no
 *       caller writes to them meanwhile.
 *   copy_into(target, buffers) -> int: the same copy into the writable buffer target
 *       (from its start; the bytes copied), which must be large enough: the aligned
 *       buffer of an O_DIRECT write (segments/direct_io.py).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define ETAG_XATTR "user.kafscale.etag"

typedef struct {
    const char *path;
    Py_buffer data;
    const char *etag; /* may be NULL */
    int fd;
    int err;
    struct stat st;
} WriteJob;

static int write_one(WriteJob *j)
{
    int fd = open(j->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    const char *p = (const char *)j->data.buf;
    Py_ssize_t left = j->data.len;
    while (left > 0) {
        ssize_t n = write(fd, p, (size_t)left);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int err = errno;
            close(fd);
            unlink(j->path);
            return err;
        }
        p += n;
        left -= n;
    }
    if (fstat(fd, &j->st) != 0) {
        int err = errno;
        close(fd);
        unlink(j->path);
        return err;
    }
    if (j->etag != NULL) {
        char value[256];
        long long mtime_ns = (long long)j->st.st_mtim.tv_sec * 1000000000LL +
                             (long long)j->st.st_mtim.tv_nsec;
        int len = snprintf(value, sizeof value, "%s %lld %lld", j->etag, mtime_ns,
                           (long long)j->st.st_size);
        if (len > 0 && (size_t)len < sizeof value)
            (void)fsetxattr(fd, ETAG_XATTR, value, (size_t)len, 0); /* optional */
    }
    j->fd = fd;
    return 0;
}

/* The i-th item of a list as a path (bytes): borrowed pointer, or NULL with an error. */
static const char *path_at(PyObject *list, Py_ssize_t i)
{
    PyObject *item = PyList_GET_ITEM(list, i);
    if (!PyBytes_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "paths must be bytes");
        return NULL;
    }
    return PyBytes_AS_STRING(item);
}

static PyObject *write_new(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *paths, *buffers, *etags;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &paths, &PyList_Type, &buffers,
                          &PyList_Type, &etags))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(buffers) != n || PyList_GET_SIZE(etags) != n) {
        PyErr_SetString(PyExc_ValueError, "paths, buffers and etags differ in length");
        return NULL;
    }
    WriteJob *jobs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(WriteJob));
    if (jobs == NULL)
        return PyErr_NoMemory();
    Py_ssize_t got = 0; /* buffers acquired */
    PyObject *out = NULL;
    for (; got < n; got++) {
        WriteJob *j = &jobs[got];
        if ((j->path = path_at(paths, got)) == NULL)
            goto done;
        PyObject *etag = PyList_GET_ITEM(etags, got);
        if (etag != Py_None && (j->etag = PyUnicode_AsUTF8(etag)) == NULL)
            goto done;
        if (PyObject_GetBuffer(PyList_GET_ITEM(buffers, got), &j->data, PyBUF_SIMPLE) < 0)
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        jobs[i].err = write_one(&jobs[i]);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        WriteJob *j = &jobs[i];
        PyObject *item;
        if (j->err) {
            item = PyLong_FromLong(j->err);
        } else {
            long long mtime_ns = (long long)j->st.st_mtim.tv_sec * 1000000000LL +
                                 (long long)j->st.st_mtim.tv_nsec;
            item = Py_BuildValue("(iKKLL)", j->fd, (unsigned long long)j->st.st_dev,
                                 (unsigned long long)j->st.st_ino, mtime_ns,
                                 (long long)j->st.st_size);
        }
        if (item == NULL) { /* out of memory: no descriptor may leak */
            for (Py_ssize_t k = i; k < n; k++)
                if (!jobs[k].err) {
                    close(jobs[k].fd);
                    unlink(jobs[k].path);
                }
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, item);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&jobs[i].data);
    PyMem_Free(jobs);
    return out;
}

static PyObject *link_all(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources, *targets;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &sources, &PyList_Type, &targets))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(sources);
    if (PyList_GET_SIZE(targets) != n) {
        PyErr_SetString(PyExc_ValueError, "sources and targets differ in length");
        return NULL;
    }
    const char **src = PyMem_Calloc((size_t)(2 * n + 1), sizeof(char *));
    int *errs = PyMem_Calloc((size_t)(n + 1), sizeof(int));
    PyObject *out = NULL;
    if (src == NULL || errs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((src[2 * i] = path_at(sources, i)) == NULL)
            goto done;
        if ((src[2 * i + 1] = path_at(targets, i)) == NULL)
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        errs[i] = link(src[2 * i], src[2 * i + 1]) == 0 ? 0 : errno;
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyLong_FromLong(errs[i]);
        if (e == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, e);
    }
done:
    PyMem_Free(src);
    PyMem_Free(errs);
    return out;
}

static PyObject *close_all(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *fds, *paths;
    int drop;
    if (!PyArg_ParseTuple(args, "O!O!p", &PyList_Type, &fds, &PyList_Type, &paths, &drop))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(fds);
    if (PyList_GET_SIZE(paths) != n) {
        PyErr_SetString(PyExc_ValueError, "fds and paths differ in length");
        return NULL;
    }
    int *fd = PyMem_Calloc((size_t)(n + 1), sizeof(int));
    const char **path = PyMem_Calloc((size_t)(n + 1), sizeof(char *));
    if (fd == NULL || path == NULL) {
        PyMem_Free(fd);
        PyMem_Free(path);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PyList_GET_ITEM(fds, i));
        fd[i] = (int)v;
        if ((v == -1 && PyErr_Occurred()) || (path[i] = path_at(paths, i)) == NULL) {
            PyMem_Free(fd);
            PyMem_Free(path);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (drop)
            (void)posix_fadvise(fd[i], 0, 0, POSIX_FADV_DONTNEED); /* advice only */
        close(fd[i]);
        (void)unlink(path[i]); /* ENOENT: already gone */
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(fd);
    PyMem_Free(path);
    Py_RETURN_NONE;
}

/* Export every buffer of seq (a sequence from PySequence_Fast) into views; their total
 * length in *total. On error: -1, an exception set, and every view released. */
static int export_all(PyObject *seq, Py_buffer *views, Py_ssize_t *total)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *total = 0;
    for (Py_ssize_t got = 0; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got],
                               PyBUF_SIMPLE) < 0) {
            for (Py_ssize_t i = 0; i < got; i++)
                PyBuffer_Release(&views[i]);
            return -1;
        }
        if (views[got].len > PY_SSIZE_T_MAX - *total) {
            for (Py_ssize_t i = 0; i <= got; i++)
                PyBuffer_Release(&views[i]);
            PyErr_SetString(PyExc_OverflowError, "buffers are too large");
            return -1;
        }
        *total += views[got].len;
    }
    return 0;
}

/* The views' bytes one after the other at dst, the GIL released while copying. */
static void copy_all(char *dst, const Py_buffer *views, Py_ssize_t n)
{
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(dst, views[i].buf, (size_t)views[i].len);
        dst += views[i].len;
    }
    Py_END_ALLOW_THREADS
}

static PyObject *join(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "join() takes a sequence of buffers");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    PyObject *out = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (export_all(seq, views, &total) < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out != NULL)
        copy_all(PyBytes_AS_STRING(out), views, n);
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
done:
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}

static PyObject *copy_into(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *target, *buffers;
    if (!PyArg_ParseTuple(args, "OO", &target, &buffers))
        return NULL;
    PyObject *seq = PySequence_Fast(buffers, "copy_into() takes a sequence of buffers");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    Py_buffer dst;
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    PyObject *out = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyObject_GetBuffer(target, &dst, PyBUF_WRITABLE) < 0)
        goto done;
    if (export_all(seq, views, &total) < 0) {
        PyBuffer_Release(&dst);
        goto done;
    }
    if (total > dst.len) {
        PyErr_SetString(PyExc_ValueError, "the target is smaller than the buffers");
    } else {
        copy_all(dst.buf, views, n);
        out = PyLong_FromSsize_t(total);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&dst);
done:
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"copy_into", copy_into, METH_VARARGS,
     "copy_into(target, buffers) -> int, copied without the GIL"},
    {"join", join, METH_O, "join(buffers) -> bytes, copied without the GIL"},
    {"write_new", write_new, METH_VARARGS,
     "write_new(paths, buffers, etags) -> [(fd, dev, ino, mtime_ns, size) | errno]"},
    {"link_all", link_all, METH_VARARGS, "link_all(sources, targets) -> [errno or 0]"},
    {"close_all", close_all, METH_VARARGS, "close_all(fds, unlink_paths, drop_cache)"},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "segments._localio",
    "The local store's batch PUT, and joins of buffers, without the GIL "
    "(see segments/local_batch.py, segments/writer.py).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__localio(void) { return PyModuleDef_Init(&module); }
