/*
 * fjord.records._speedups: the hot loops of RecordBatch v2 in C (issue 18).
 *
 * What is here, and nothing else:
 *
 *   RecordAppender      the record-by-record half of BatchBuilder: append() encodes one record
 *                       (length varint, attributes 0, timestamp delta varlong, offset delta
 *                       varint, key, value, headers) into a growing buffer; try_append() the
 *                       same, answering the record's index or -1; take_records() returns the
 *                       records section with its count and timestamps, in one step. BatchBuilder (builder.py) subclasses it and
 *                       writes the 61-byte header (CRC-32C by the crc32c package) in Python.
 *   decode_record_tuples(data, base_offset, base_timestamp, record_count, last_offset_delta)
 *                       -> [(offset, timestamp, key, value, headers), ...]
 *   decode_records_as(cls, data, base_offset, base_timestamp, record_count, last_offset_delta,
 *                     min_offset, topic, partition, fixed_timestamp)
 *                       -> [cls(topic, partition, offset, key, value, headers, timestamp), ...]
 *                       for the records at or after min_offset (cls: a tuple subclass, e.g. the
 *                       consumer's ConsumerRecord NamedTuple, filled as tuple.__new__ would).
 *   RecordAppender.try_append_many(timestamp_ms, keys, values, start)
 *                       try_append() over lists of records, until one is refused (the
 *                       producer's send_many).
 *   murmur2(data), group_by_partition(keys, values, num_partitions, null_key_partition)
 *                       Kafka's keyed partitioner (fjord.client.partitioner is the reference).
 *   binary_column(records, index), int64_column(records, index, multiplier)
 *                       one field of a list of tuples (ConsumerRecords) as the buffers of an
 *                       Arrow column, so that a columnar consumer of records (the Spark
 *                       source, fjord_spark.arrow) pays no Python per record; the pure path
 *                       there builds the same columns with pyarrow from lists.
 *   FastSend            the producer's send(topic, value) for a record without key or
 *                       headers in one C call (the Python send() holds the same path and is
 *                       called for everything else).
 *   ColumnBuilder       records sections decoded straight into those buffers (no Python object
 *                       per record: the consumer's poll_into, the Spark source's read tasks);
 *                       a section it does not decode itself (headers, anything malformed) is
 *                       left to decode_records_as and appended from its records.
 *
 * Contract with the pure-Python implementation (builder.py, reader.py), which stays the
 * reference and the fallback: for every input both accept, both produce the same bytes (builder)
 * or the same objects (decoders). Anything this code does not handle itself - a key that is a
 * bytearray, headers to encode, a timestamp out of range, and every malformed record section -
 * is handed to the Python functions, so errors (types and messages) are the Python ones by
 * construction: the decoders re-run the whole section through the Python decoder when they meet
 * anything they would reject, and return what it returns (or raise what it raises).
 *
 * Nothing here releases the GIL, so an append() and a take_records() on one appender never
 * interleave (the producer's accumulator relies on that for its lock-free appends).
 */

#define _POSIX_C_SOURCE 200809L
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MIN_RECORD_BODY 6
#define INT32_MAX_VALUE 2147483647LL

/* ---------------------------------------------------------------- lazy Python lookups */

static PyObject *
python_attr(const char *module_name, const char *name)
{
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL)
        return NULL;
    PyObject *attr = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return attr;
}

/* Call fjord.records.<module>.<name>(*args) (a new reference, or NULL with the exception). */
static PyObject *
call_python(const char *module_name, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fn = python_attr(module_name, name);
    if (fn == NULL)
        return NULL;
    PyObject *result = PyObject_Vectorcall(fn, args, (size_t)nargs, NULL);
    Py_DECREF(fn);
    return result;
}

static void
raise_invalid_record(PyObject *message)
{
    PyObject *cls = python_attr("fjord.errors", "InvalidRecordError");
    if (cls == NULL)
        return;
    PyErr_SetObject(cls, message);
    Py_DECREF(cls);
}

/* For the Python helpers that must raise (range checks): if one returns instead, say so. */
static PyObject *
expect_raised(PyObject *result, const char *what)
{
    if (result != NULL) {
        Py_DECREF(result);
        PyErr_Format(PyExc_SystemError, "fjord.records._speedups: %s did not raise", what);
    }
    return NULL;
}

/* ---------------------------------------------------------------- varints */

static inline uint64_t
zigzag(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

static inline Py_ssize_t
unsigned_varint_size(uint64_t value)
{
    Py_ssize_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static inline Py_ssize_t
zigzag_size(int64_t value)
{
    return unsigned_varint_size(zigzag(value));
}

static inline char *
put_zigzag(char *out, int64_t value)
{
    uint64_t zz = zigzag(value);
    while (zz >= 0x80) {
        *out++ = (char)((zz & 0x7F) | 0x80);
        zz >>= 7;
    }
    *out++ = (char)zz;
    return out;
}

/* Decode the zigzag varlong at data[*pos], reading no byte at or past end. 0 on success;
 * -1 when it runs past end, is longer than ten bytes or holds more than 64 bits (the cases
 * varint.decode_zigzag rejects). */
static inline int
get_zigzag(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    Py_ssize_t p = *pos;
    uint64_t result = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return -1;
        unsigned char byte = data[p++];
        if (i == 9 && byte > 1)
            return -1;
        result |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *out = (int64_t)((result >> 1) ^ (0 - (result & 1)));
            *pos = p;
            return 0;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- RecordFutureBase */

/* The fields of fjord.client.futures.RecordFuture (a Python subclass adds the methods): the
 * batch's completion, the record's index in the batch, its timestamp. */
typedef struct {
    PyObject_HEAD
    PyObject *batch;
    long long relative_offset;
    long long timestamp;
} FutureBase;

static int
FutureBase_init(FutureBase *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"batch", "relative_offset", "timestamp", NULL};
    PyObject *batch;
    long long relative_offset, timestamp;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLL", kwlist, &batch, &relative_offset,
                                     &timestamp))
        return -1;
    Py_INCREF(batch);
    Py_XSETREF(self->batch, batch);
    self->relative_offset = relative_offset;
    self->timestamp = timestamp;
    return 0;
}

static int
FutureBase_traverse(FutureBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    return 0;
}

static int
FutureBase_clear(FutureBase *self)
{
    Py_CLEAR(self->batch);
    return 0;
}

static void
FutureBase_dealloc(FutureBase *self)
{
    PyObject_GC_UnTrack(self);
    FutureBase_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
FutureBase_get_batch(FutureBase *self, void *Py_UNUSED(closure))
{
    if (self->batch == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->batch);
    return self->batch;
}

static PyObject *
FutureBase_get_relative_offset(FutureBase *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->relative_offset);
}

static PyObject *
FutureBase_get_timestamp(FutureBase *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->timestamp);
}

static PyGetSetDef FutureBase_getset[] = {
    {"_batch", (getter)FutureBase_get_batch, NULL, "The batch's completion.", NULL},
    {"_relative_offset", (getter)FutureBase_get_relative_offset, NULL,
     "The record's index in its batch.", NULL},
    {"_timestamp", (getter)FutureBase_get_timestamp, NULL, "The record's timestamp (ms).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FutureBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fjord.records._speedups.RecordFutureBase",
    .tp_doc = "RecordFutureBase(batch, relative_offset, timestamp): the fields of "
              "fjord.client.futures.RecordFuture.",
    .tp_basicsize = sizeof(FutureBase),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FutureBase_init,
    .tp_traverse = (traverseproc)FutureBase_traverse,
    .tp_clear = (inquiry)FutureBase_clear,
    .tp_dealloc = (destructor)FutureBase_dealloc,
    .tp_getset = FutureBase_getset,
};

/* ---------------------------------------------------------------- RecordAppender */

typedef struct {
    PyObject_HEAD
    char *buf;              /* the records section so far */
    Py_ssize_t len;         /* bytes used in buf */
    Py_ssize_t cap;         /* bytes allocated */
    Py_ssize_t batch_size;  /* a later record is refused when the batch would exceed it */
    Py_ssize_t size;        /* header + records: the uncompressed batch's size */
    int64_t count;
    int64_t base_timestamp; /* the first record's timestamp */
    int64_t max_timestamp;
    int closed;             /* take_records() was called: no more appends */
    int sealed;             /* seal() was called: try_append() refuses every record */
} Appender;

#define BATCH_HEADER_SIZE 61

static int
Appender_init(Appender *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"batch_size", NULL};
    Py_ssize_t batch_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &batch_size))
        return -1;
    if (batch_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be positive");
        return -1;
    }
    PyMem_Free(self->buf);
    self->buf = NULL;
    self->len = self->cap = 0;
    self->batch_size = batch_size;
    self->size = BATCH_HEADER_SIZE;
    self->count = 0;
    self->base_timestamp = 0;
    self->max_timestamp = -1;
    self->closed = 0;
    self->sealed = 0;
    return 0;
}

static void
Appender_dealloc(Appender *self)
{
    PyMem_Free(self->buf);
    self->buf = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Appender_reserve(Appender *self, Py_ssize_t extra)
{
    Py_ssize_t needed = self->len + extra;
    if (needed <= self->cap)
        return 0;
    Py_ssize_t cap = self->cap ? self->cap : 1024;
    while (cap < needed) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            cap = needed;
            break;
        }
        cap *= 2;
    }
    char *buf = PyMem_Realloc(self->buf, (size_t)cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = buf;
    self->cap = cap;
    return 0;
}

/* A key or value as (pointer, length), or length -1 for None. Exact bytes are used as they
 * are; anything else goes through builder._as_bytes (bytes-likes copied, other types refused
 * with the Python error). *owned receives a reference to release, or NULL. */
static int
as_field(PyObject *obj, const char *what, const char **ptr, Py_ssize_t *len, PyObject **owned)
{
    *owned = NULL;
    if (obj == Py_None) {
        *ptr = NULL;
        *len = -1;
        return 0;
    }
    if (!PyBytes_CheckExact(obj)) {
        PyObject *name = PyUnicode_FromString(what);
        if (name == NULL)
            return -1;
        PyObject *args[2] = {obj, name};
        PyObject *converted = call_python("fjord.records.builder", "_as_bytes", args, 2);
        Py_DECREF(name);
        if (converted == NULL)
            return -1;
        if (!PyBytes_Check(converted)) {
            Py_DECREF(converted);
            PyErr_SetString(PyExc_SystemError, "builder._as_bytes returned no bytes");
            return -1;
        }
        *owned = obj = converted;
    }
    *ptr = PyBytes_AS_STRING(obj);
    *len = PyBytes_GET_SIZE(obj);
    return 0;
}

/* The arguments (timestamp_ms, key, value, headers=()) of append() / try_append(), positional
 * or by keyword, into argv (headers NULL when not given). */
static int
parse_append_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **argv)
{
    static const char *names[4] = {"timestamp_ms", "key", "value", "headers"};
    argv[0] = argv[1] = argv[2] = argv[3] = NULL;
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "append() takes at most 4 arguments (%zd given)", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        argv[i] = args[i];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
            int found = 0;
            for (int i = 0; i < 4; i++) {
                if (PyUnicode_CompareWithASCIIString(kw, names[i]) == 0) {
                    if (argv[i] != NULL) {
                        PyErr_Format(PyExc_TypeError, "append() got multiple values for '%s'",
                                     names[i]);
                        return -1;
                    }
                    argv[i] = args[nargs + k];
                    found = 1;
                    break;
                }
            }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "append() got an unexpected keyword argument %R",
                             kw);
                return -1;
            }
        }
    }
    for (int i = 0; i < 3; i++) {
        if (argv[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "append() missing required argument '%s'", names[i]);
            return -1;
        }
    }
    return 0;
}

#define APPEND_REFUSED (-1)  /* does not fit, or (try mode) closed or sealed */
#define APPEND_ERROR (-2)    /* an exception is set */

/* Append one record. Returns its index in the batch, APPEND_REFUSED or APPEND_ERROR. Not in
 * try mode, a closed appender raises (InvalidRecordError) and seal() is ignored. */
static int64_t
append_core(Appender *self, PyObject *timestamp_obj, PyObject *key_obj, PyObject *value_obj,
            PyObject *headers_obj, int try_mode)
{
    int64_t result = APPEND_ERROR;
    if (try_mode && (self->closed || self->sealed))
        return APPEND_REFUSED;
    if (self->closed) {
        PyObject *message = PyUnicode_FromString("cannot append to a batch that has been built");
        if (message != NULL) {
            raise_invalid_record(message);
            Py_DECREF(message);
        }
        return APPEND_ERROR;
    }
    if (!PyLong_CheckExact(timestamp_obj)) {
        PyObject *type_name = PyType_GetName(Py_TYPE(timestamp_obj));
        if (type_name == NULL)
            return APPEND_ERROR;
        PyObject *message = PyUnicode_FromFormat("record timestamp must be an int (ms), got %U",
                                                 type_name);
        Py_DECREF(type_name);
        if (message != NULL) {
            raise_invalid_record(message);
            Py_DECREF(message);
        }
        return APPEND_ERROR;
    }
    int overflow = 0;
    long long timestamp = PyLong_AsLongLongAndOverflow(timestamp_obj, &overflow);
    if (timestamp == -1 && PyErr_Occurred())
        return APPEND_ERROR;

    const char *key = NULL, *value = NULL;
    Py_ssize_t key_len, value_len;
    PyObject *key_owned = NULL, *value_owned = NULL, *headers_bytes = NULL;
    if (as_field(key_obj, "key", &key, &key_len, &key_owned) < 0)
        goto done;
    if (as_field(value_obj, "value", &value, &value_len, &value_owned) < 0)
        goto done;

    int64_t count = self->count;
    int64_t delta = 0;
    if (overflow) {
        /* Out of int64: the Python range check raises (at append, where the pure builder
         * raises at append or, for a delta it can still encode, at build). */
        PyObject *what = PyUnicode_FromString("record timestamp");
        PyObject *low = PyLong_FromLongLong(INT64_MIN);
        PyObject *high = PyLong_FromLongLong(INT64_MAX);
        if (what != NULL && low != NULL && high != NULL) {
            PyObject *check_args[4] = {what, timestamp_obj, low, high};
            expect_raised(call_python("fjord.records.builder", "_check_range", check_args, 4),
                          "the timestamp range check");
        }
        Py_XDECREF(what);
        Py_XDECREF(low);
        Py_XDECREF(high);
        goto done;
    }
    if (count && __builtin_sub_overflow((int64_t)timestamp, self->base_timestamp, &delta)) {
        PyObject *base = PyLong_FromLongLong(self->base_timestamp);
        if (base != NULL) {
            PyObject *delta_args[2] = {timestamp_obj, base};
            expect_raised(
                call_python("fjord.records.builder", "_timestamp_delta", delta_args, 2),
                "the timestamp delta check");
            Py_DECREF(base);
        }
        goto done;
    }
    Py_ssize_t headers_len = 1;  /* zigzag(0): no headers */
    if (headers_obj != NULL) {
        int has_headers = PyObject_IsTrue(headers_obj);
        if (has_headers < 0)
            goto done;
        if (has_headers) {
            headers_bytes = call_python("fjord.records.builder", "_encode_headers",
                                        &headers_obj, 1);
            if (headers_bytes == NULL)
                goto done;
            if (!PyBytes_Check(headers_bytes)) {
                PyErr_SetString(PyExc_SystemError, "builder._encode_headers returned no bytes");
                goto done;
            }
            headers_len = PyBytes_GET_SIZE(headers_bytes);
        }
    }
    Py_ssize_t body_len = 1 + zigzag_size(delta) + zigzag_size(count)
        + (key_len < 0 ? 1 : zigzag_size(key_len) + key_len)
        + (value_len < 0 ? 1 : zigzag_size(value_len) + value_len) + headers_len;
    Py_ssize_t length_size = zigzag_size(body_len);
    Py_ssize_t size = self->size + length_size + body_len;
    if (count && (size > self->batch_size || count == INT32_MAX_VALUE)) {
        result = APPEND_REFUSED;
        goto done;
    }
    if (Appender_reserve(self, length_size + body_len) < 0)
        goto done;
    char *out = self->buf + self->len;
    out = put_zigzag(out, body_len);
    *out++ = 0;  /* attributes */
    out = put_zigzag(out, delta);
    out = put_zigzag(out, count);
    if (key_len < 0) {
        out = put_zigzag(out, -1);
    } else {
        out = put_zigzag(out, key_len);
        memcpy(out, key, (size_t)key_len);
        out += key_len;
    }
    if (value_len < 0) {
        out = put_zigzag(out, -1);
    } else {
        out = put_zigzag(out, value_len);
        memcpy(out, value, (size_t)value_len);
        out += value_len;
    }
    if (headers_bytes != NULL) {
        memcpy(out, PyBytes_AS_STRING(headers_bytes), (size_t)headers_len);
        out += headers_len;
    } else {
        *out++ = 0;
    }
    self->len = out - self->buf;
    if (count == 0) {
        self->base_timestamp = self->max_timestamp = timestamp;
    } else if (timestamp > self->max_timestamp) {
        self->max_timestamp = timestamp;
    }
    self->size = size;
    self->count = count + 1;
    result = count;
done:
    Py_XDECREF(key_owned);
    Py_XDECREF(value_owned);
    Py_XDECREF(headers_bytes);
    return result;
}

static PyObject *
Appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[4];
    if (parse_append_args(args, nargs, kwnames, argv) < 0)
        return NULL;
    int64_t index = append_core(self, argv[0], argv[1], argv[2], argv[3], 0);
    if (index == APPEND_ERROR)
        return NULL;
    return PyBool_FromLong(index >= 0);
}

static PyObject *
Appender_try_append(Appender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[4];
    if (parse_append_args(args, nargs, kwnames, argv) < 0)
        return NULL;
    int64_t index = append_core(self, argv[0], argv[1], argv[2], argv[3], 1);
    if (index == APPEND_ERROR)
        return NULL;
    return PyLong_FromLongLong(index);
}

/* try_append_future(future_type, completion, timestamp_ms, key, value): the producer's fast
 * path in one call. Appends (as try_append, no headers) and returns
 * future_type(completion, index, timestamp_ms), or None when the record was refused.
 * timestamp_ms None: now, from the wall clock. */
static int
check_future_type(PyObject *future_type, const char *who)
{
    if (!PyType_Check(future_type)
        || !PyType_IsSubtype((PyTypeObject *)future_type, &FutureBaseType)) {
        PyErr_Format(PyExc_TypeError, "%s: future_type must subclass RecordFutureBase", who);
        return -1;
    }
    return 0;
}

/* try_append_future's work, with future_type already checked: the future, Py_None (a new
 * reference) when the record was refused, NULL with an exception set. */
static PyObject *
append_future(Appender *self, PyObject *future_type, PyObject *completion,
              PyObject *timestamp_obj, PyObject *key, PyObject *value)
{
    PyObject *now = NULL;
    if (timestamp_obj == Py_None) {
        /* The wall clock in ms, as int(time.time() * 1000) (one Python call less per record). */
        struct timespec clock;
        if (clock_gettime(CLOCK_REALTIME, &clock) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        now = PyLong_FromLongLong((long long)clock.tv_sec * 1000 + clock.tv_nsec / 1000000);
        if (now == NULL)
            return NULL;
        timestamp_obj = now;
    }
    int64_t index = append_core(self, timestamp_obj, key, value, NULL, 1);
    long long timestamp = index >= 0 ? PyLong_AsLongLong(timestamp_obj) : 0;  /* (checked) */
    Py_XDECREF(now);
    if (index == APPEND_ERROR)
        return NULL;
    if (index < 0)
        Py_RETURN_NONE;
    PyTypeObject *type = (PyTypeObject *)future_type;
    PyObject *future = type->tp_alloc(type, 0);
    if (future == NULL)
        return NULL;
    FutureBase *base = (FutureBase *)future;
    Py_INCREF(completion);
    base->batch = completion;
    base->relative_offset = index;
    base->timestamp = timestamp;
    return future;
}

static PyObject *
Appender_try_append_future(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "try_append_future() takes 5 arguments (future_type, completion, "
                     "timestamp_ms, key, value), %zd given", nargs);
        return NULL;
    }
    if (check_future_type(args[0], "try_append_future()") < 0)
        return NULL;
    return append_future(self, args[0], args[1], args[2], args[3], args[4]);
}

/* try_append_many(timestamp_ms, keys, values, start) -> next: appends records start, start+1,
 * ... (keys[i] or None when keys is None, values[i], no headers, all with timestamp_ms) as
 * try_append() would, one by one, until one is refused or the lists end; returns the index of
 * the first record not appended (start when none was). keys and values: lists of the same
 * length. Errors as try_append()'s (the records before the failing one stay appended). */
static PyObject *
Appender_try_append_many(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "try_append_many() takes 4 arguments (timestamp_ms, keys, values, start), "
                     "%zd given", nargs);
        return NULL;
    }
    PyObject *timestamp_obj = args[0], *keys = args[1], *values = args[2];
    if (!PyList_Check(values) || (keys != Py_None && !PyList_Check(keys))) {
        PyErr_SetString(PyExc_TypeError, "try_append_many(): keys (or None) and values must be "
                        "lists");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(values);
    if (keys != Py_None && PyList_GET_SIZE(keys) != count) {
        PyErr_SetString(PyExc_ValueError, "try_append_many(): keys and values differ in length");
        return NULL;
    }
    Py_ssize_t index = PyLong_AsSsize_t(args[3]);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0) {
        PyErr_SetString(PyExc_ValueError, "try_append_many(): start must be >= 0");
        return NULL;
    }
    for (; index < count; index++) {
        /* (a list may shrink under a callback run by a conversion: re-check the bound) */
        if (index >= PyList_GET_SIZE(values)
            || (keys != Py_None && index >= PyList_GET_SIZE(keys))) {
            PyErr_SetString(PyExc_ValueError, "try_append_many(): a list changed size");
            return NULL;
        }
        PyObject *value = PyList_GET_ITEM(values, index);
        PyObject *key = keys == Py_None ? Py_None : PyList_GET_ITEM(keys, index);
        Py_INCREF(value);
        Py_INCREF(key);
        int64_t result = append_core(self, timestamp_obj, key, value, NULL, 1);
        Py_DECREF(value);
        Py_DECREF(key);
        if (result == APPEND_ERROR)
            return NULL;
        if (result < 0)
            break;
    }
    return PyLong_FromSsize_t(index);
}

static PyObject *
Appender_seal(Appender *self, PyObject *Py_UNUSED(ignored))
{
    self->sealed = 1;
    Py_RETURN_NONE;
}

static PyObject *
Appender_take_records(Appender *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed) {
        PyObject *message = PyUnicode_FromString("the records were already taken");
        if (message != NULL) {
            raise_invalid_record(message);
            Py_DECREF(message);
        }
        return NULL;
    }
    PyObject *taken = Py_BuildValue("(y#LLL)", self->buf ? self->buf : "", self->len,
                                    (long long)self->count, (long long)self->base_timestamp,
                                    (long long)self->max_timestamp);
    if (taken == NULL)
        return NULL;
    self->closed = 1;
    PyMem_Free(self->buf);
    self->buf = NULL;
    self->cap = 0;
    return taken;
}

static PyObject *
Appender_get_record_count(Appender *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->count);
}

static PyObject *
Appender_get_size(Appender *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->size);
}

static PyObject *
Appender_get_base_timestamp(Appender *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->base_timestamp);
}

static PyObject *
Appender_get_max_timestamp(Appender *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->max_timestamp);
}

static PyObject *
Appender_get_records_taken(Appender *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed);
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Appender_append, METH_FASTCALL | METH_KEYWORDS,
     "append(timestamp_ms, key, value, headers=()) -> bool: add a record; False (adding "
     "nothing) when it would overflow batch_size (the first record is always accepted)."},
    {"try_append", (PyCFunction)(void (*)(void))Appender_try_append,
     METH_FASTCALL | METH_KEYWORDS,
     "try_append(timestamp_ms, key, value, headers=()) -> int: as append(), but returns the "
     "record's index in the batch, or -1 (adding nothing) when it would overflow batch_size "
     "or the records were already taken (never raises for that)."},
    {"try_append_future", (PyCFunction)(void (*)(void))Appender_try_append_future,
     METH_FASTCALL,
     "try_append_future(future_type, completion, timestamp_ms, key, value) -> future or None: "
     "try_append() without headers, then future_type(completion, index, timestamp_ms) in the "
     "same call (the producer's fast path); timestamp_ms None: now (wall clock, ms)."},
    {"try_append_many", (PyCFunction)(void (*)(void))Appender_try_append_many, METH_FASTCALL,
     "try_append_many(timestamp_ms, keys, values, start) -> int: try_append() of records "
     "start.. (keys None: null keys; no headers) until one is refused or the lists end; "
     "returns the index of the first record not appended."},
    {"seal", (PyCFunction)Appender_seal, METH_NOARGS,
     "From now on try_append() and try_append_future() refuse every record (the producer's "
     "accumulator seals a batch that stops being its partition's open one)."},
    {"take_records", (PyCFunction)Appender_take_records, METH_NOARGS,
     "take_records() -> (records section, record count, base timestamp, max timestamp), "
     "taken at once (no append can slip in between); no append is accepted afterwards."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Appender_getset[] = {
    {"record_count", (getter)Appender_get_record_count, NULL, "Records appended.", NULL},
    {"size_in_bytes", (getter)Appender_get_size, NULL,
     "Bytes of the batch if built now without compression (header included).", NULL},
    {"base_timestamp", (getter)Appender_get_base_timestamp, NULL,
     "The first record's timestamp (0 before it).", NULL},
    {"max_timestamp", (getter)Appender_get_max_timestamp, NULL,
     "The largest timestamp appended (-1 before the first record).", NULL},
    {"records_taken", (getter)Appender_get_records_taken, NULL,
     "Whether take_records() was called (no append is accepted any more).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fjord.records._speedups.RecordAppender",
    .tp_doc = "RecordAppender(batch_size): the records section of one RecordBatch v2, encoded "
              "as records are appended (see fjord.records.builder.PyRecordAppender, the same "
              "in Python).",
    .tp_basicsize = sizeof(Appender),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
    .tp_getset = Appender_getset,
};

/* ---------------------------------------------------------------- FastSend */

/* FastSend(targets, future_type, fallback, value_limit): the producer's send(topic, value) for
 * a record without key, partition, headers or timestamp, whole in C. targets maps a topic to
 * (appender, completion, ...): the batch its sticky partition is filling. A call with exactly
 * (topic, value) positionally, value a bytes object of at most value_limit bytes and the topic
 * in targets, appends with append_future (timestamp: now) and returns the future; every other
 * call, and a record the batch refuses, is fallback(*args, **kwargs) (the Python send(),
 * which holds the same fast path, so both give the same batches). close() makes every later
 * call the fallback's. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *targets;
    PyObject *future_type;
    PyObject *fallback;
    Py_ssize_t value_limit;
    int closed;
} FastSend;

static PyObject *
FastSend_vectorcall(FastSend *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL && !self->closed) {
        PyObject *value = args[1];
        if (PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) <= self->value_limit) {
            PyObject *target = PyDict_GetItemWithError(self->targets, args[0]); /* borrowed */
            if (target == NULL && PyErr_Occurred())
                return NULL;
            if (target != NULL && PyTuple_CheckExact(target) && PyTuple_GET_SIZE(target) >= 2
                && PyObject_TypeCheck(PyTuple_GET_ITEM(target, 0), &AppenderType)) {
                /* The tuple may leave targets during the append (nothing here releases the
                 * GIL, but hold it anyway). */
                Py_INCREF(target);
                PyObject *future = append_future(
                    (Appender *)PyTuple_GET_ITEM(target, 0), self->future_type,
                    PyTuple_GET_ITEM(target, 1), Py_None, Py_None, value);
                Py_DECREF(target);
                if (future != Py_None)
                    return future; /* the future, or NULL with the exception */
                Py_DECREF(future);
            }
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
FastSend_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"targets", "future_type", "fallback", "value_limit", NULL};
    PyObject *targets, *future_type, *fallback;
    Py_ssize_t value_limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOn", kwlist, &PyDict_Type, &targets,
                                     &future_type, &fallback, &value_limit))
        return NULL;
    if (check_future_type(future_type, "FastSend()") < 0)
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "FastSend(): fallback must be callable");
        return NULL;
    }
    FastSend *self = (FastSend *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)FastSend_vectorcall;
    Py_INCREF(targets);
    self->targets = targets;
    Py_INCREF(future_type);
    self->future_type = future_type;
    Py_INCREF(fallback);
    self->fallback = fallback;
    self->value_limit = value_limit;
    self->closed = 0;
    return (PyObject *)self;
}

static int
FastSend_traverse(FastSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->targets);
    Py_VISIT(self->future_type);
    Py_VISIT(self->fallback);
    return 0;
}

static int
FastSend_clear(FastSend *self)
{
    Py_CLEAR(self->targets);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
FastSend_dealloc(FastSend *self)
{
    PyObject_GC_UnTrack(self);
    FastSend_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
FastSend_call(FastSend *self, PyObject *args, PyObject *kwargs)
{
    /* tp_call for callers that do not use vectorcall (the same behaviour). */
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static PyObject *
FastSend_close(FastSend *self, PyObject *Py_UNUSED(ignored))
{
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *
FastSend_get_closed(FastSend *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed);
}

static PyMethodDef FastSend_methods[] = {
    {"close", (PyCFunction)FastSend_close, METH_NOARGS,
     "From now on every call goes to the fallback (the producer closed)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *
FastSend_get_wrapped(FastSend *self, void *Py_UNUSED(closure))
{
    Py_INCREF(self->fallback);
    return self->fallback;
}

static PyGetSetDef FastSend_getset[] = {
    {"closed", (getter)FastSend_get_closed, NULL, "Whether close() was called.", NULL},
    {"__wrapped__", (getter)FastSend_get_wrapped, NULL,
     "The fallback (inspect.signature and help() show its signature).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastSendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fjord.records._speedups.FastSend",
    .tp_doc = "FastSend(targets, future_type, fallback, value_limit): the producer's "
              "send(topic, value) fast path in C; every other call is fallback(...).",
    .tp_basicsize = sizeof(FastSend),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FastSend, vectorcall),
    .tp_call = (ternaryfunc)FastSend_call,
    .tp_new = FastSend_new,
    .tp_traverse = (traverseproc)FastSend_traverse,
    .tp_clear = (inquiry)FastSend_clear,
    .tp_dealloc = (destructor)FastSend_dealloc,
    .tp_methods = FastSend_methods,
    .tp_getset = FastSend_getset,
};

/* ---------------------------------------------------------------- decoding */

/* One record's fields; key/value/headers are new references on success. */
typedef struct {
    int64_t offset;
    int64_t timestamp;
    PyObject *key;
    PyObject *value;
    PyObject *headers;
} DecodedRecord;

enum { DECODE_OK = 0, DECODE_REJECT = 1, DECODE_ERROR = -1 };

/* Headers from data[*pos] up to record_end (the count varint is not 0 here). */
static int
decode_headers(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t record_end,
               PyObject **out)
{
    int64_t count;
    if (get_zigzag(data, pos, record_end, &count) < 0)
        return DECODE_REJECT;
    if (count < 0 || count > record_end - *pos)
        return DECODE_REJECT;
    PyObject *headers = PyTuple_New((Py_ssize_t)count);
    if (headers == NULL)
        return DECODE_ERROR;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)count; i++) {
        int64_t name_len, value_len;
        if (get_zigzag(data, pos, record_end, &name_len) < 0 || name_len < 0
            || name_len > record_end - *pos)
            goto reject;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)data + *pos, (Py_ssize_t)name_len,
                                              NULL);
        if (name == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                goto reject;
            }
            Py_DECREF(headers);
            return DECODE_ERROR;
        }
        *pos += (Py_ssize_t)name_len;
        PyObject *value;
        if (get_zigzag(data, pos, record_end, &value_len) < 0) {
            Py_DECREF(name);
            goto reject;
        }
        if (value_len == -1) {
            value = Py_None;
            Py_INCREF(value);
        } else if (value_len >= 0 && value_len <= record_end - *pos) {
            value = PyBytes_FromStringAndSize((const char *)data + *pos, (Py_ssize_t)value_len);
            if (value == NULL) {
                Py_DECREF(name);
                Py_DECREF(headers);
                return DECODE_ERROR;
            }
            *pos += (Py_ssize_t)value_len;
        } else {
            Py_DECREF(name);
            goto reject;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(name);
            Py_DECREF(value);
            Py_DECREF(headers);
            return DECODE_ERROR;
        }
        PyTuple_SET_ITEM(pair, 0, name);
        PyTuple_SET_ITEM(pair, 1, value);
        PyObject_GC_UnTrack(pair);  /* (str and bytes/None only: see untrack_record) */
        PyTuple_SET_ITEM(headers, i, pair);
    }
    PyObject_GC_UnTrack(headers);
    *out = headers;
    return DECODE_OK;
reject:
    Py_DECREF(headers);
    return DECODE_REJECT;
}

static PyObject *
bytes_or_none(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t record_end, int *status)
{
    int64_t length;
    if (get_zigzag(data, pos, record_end, &length) < 0) {
        *status = DECODE_REJECT;
        return NULL;
    }
    if (length == -1) {
        Py_RETURN_NONE;
    }
    if (length < 0 || length > record_end - *pos) {
        *status = DECODE_REJECT;
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)data + *pos, (Py_ssize_t)length);
    if (out == NULL) {
        *status = DECODE_ERROR;
        return NULL;
    }
    *pos += (Py_ssize_t)length;
    return out;
}

/* Decode the record at data[*pos]. Checks exactly what reader.decode_record_tuples checks. */
static int
decode_one(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end, int64_t base_offset,
           int64_t base_timestamp, int64_t *previous_delta, int64_t last_offset_delta,
           DecodedRecord *record)
{
    int64_t length, timestamp_delta, offset_delta;
    int status = DECODE_OK;
    if (get_zigzag(data, pos, end, &length) < 0)
        return DECODE_REJECT;
    if (length < MIN_RECORD_BODY || length > end - *pos)
        return DECODE_REJECT;
    Py_ssize_t record_end = *pos + (Py_ssize_t)length;
    if (data[*pos] != 0)  /* attributes */
        return DECODE_REJECT;
    *pos += 1;
    if (get_zigzag(data, pos, record_end, &timestamp_delta) < 0
        || get_zigzag(data, pos, record_end, &offset_delta) < 0)
        return DECODE_REJECT;
    if (offset_delta <= *previous_delta || offset_delta > last_offset_delta)
        return DECODE_REJECT;
    *previous_delta = offset_delta;
    if (__builtin_add_overflow(base_offset, offset_delta, &record->offset)
        || __builtin_add_overflow(base_timestamp, timestamp_delta, &record->timestamp))
        return DECODE_REJECT;  /* (the Python decoder returns ints past int64 here) */
    record->key = bytes_or_none(data, pos, record_end, &status);
    if (record->key == NULL)
        return status;
    record->value = bytes_or_none(data, pos, record_end, &status);
    if (record->value == NULL) {
        Py_DECREF(record->key);
        return status;
    }
    if (*pos < record_end && data[*pos] == 0) {
        record->headers = PyTuple_New(0);
        *pos += 1;
        if (record->headers == NULL)
            status = DECODE_ERROR;
    } else {
        status = decode_headers(data, pos, record_end, &record->headers);
    }
    if (status == DECODE_OK && *pos != record_end) {
        Py_DECREF(record->headers);
        status = DECODE_REJECT;
    }
    if (status != DECODE_OK) {
        Py_DECREF(record->key);
        Py_DECREF(record->value);
    }
    return status;
}

static int
int64_arg(PyObject *obj, int64_t *out)
{
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        return 1;
    *out = value;
    return 0;
}

/* The pure-Python reader's function of the same name, called with the same arguments: the
 * answer (or the error) for an input this code rejects. */
static PyObject *
python_decoder(const char *name, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t data_at)
{
    /* The Python decoder slices its input into keys and values: give it bytes. */
    PyObject *copy[10];
    if (nargs > 10) {
        PyErr_SetString(PyExc_SystemError, "python_decoder: too many arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        copy[i] = args[i];
    PyObject *data = PyBytes_FromObject(args[data_at]);
    if (data == NULL)
        return NULL;
    copy[data_at] = data;
    PyObject *result = call_python("fjord.records.reader", name, copy, nargs);
    Py_DECREF(data);
    return result;
}

/* The shared loop. cls == NULL: tuples (offset, timestamp, key, value, headers); else
 * cls(topic, partition, offset, key, value, headers, timestamp) for offsets >= min_offset,
 * timestamp = fixed_timestamp when that is not NULL. Returns the list, or NULL with
 * *rejected = 1 (no exception set) when the section must go to the Python decoder. */
static PyObject *
decode_section(PyObject *data_obj, PyObject *base_offset_obj, PyObject *base_timestamp_obj,
               PyObject *record_count_obj, PyObject *last_offset_delta_obj, PyTypeObject *cls,
               PyObject *min_offset_obj, PyObject *topic, PyObject *partition,
               PyObject *fixed_timestamp, int *rejected)
{
    int64_t base_offset, base_timestamp, record_count, last_offset_delta, min_offset = INT64_MIN;
    int conv;
    *rejected = 0;
    if ((conv = int64_arg(base_offset_obj, &base_offset)) != 0
        || (conv = int64_arg(base_timestamp_obj, &base_timestamp)) != 0
        || (conv = int64_arg(record_count_obj, &record_count)) != 0
        || (conv = int64_arg(last_offset_delta_obj, &last_offset_delta)) != 0
        || (min_offset_obj != NULL && (conv = int64_arg(min_offset_obj, &min_offset)) != 0)) {
        if (conv > 0)
            *rejected = 1;
        return NULL;
    }
    if (record_count < 0) {
        *rejected = 1;
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    int64_t previous_delta = -1;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (int64_t i = 0; i < record_count; i++) {
        DecodedRecord record = {0, 0, NULL, NULL, NULL};
        int status = decode_one(data, &pos, end, base_offset, base_timestamp, &previous_delta,
                                last_offset_delta, &record);
        if (status != DECODE_OK) {
            if (status == DECODE_REJECT)
                *rejected = 1;
            goto fail;
        }
        PyObject *item;
        if (cls == NULL) {
            item = PyTuple_New(5);
            if (item == NULL)
                goto fail_record;
            PyObject *offset = PyLong_FromLongLong(record.offset);
            PyObject *timestamp = PyLong_FromLongLong(record.timestamp);
            if (offset == NULL || timestamp == NULL) {
                Py_XDECREF(offset);
                Py_XDECREF(timestamp);
                Py_DECREF(item);
                goto fail_record;
            }
            PyTuple_SET_ITEM(item, 0, offset);
            PyTuple_SET_ITEM(item, 1, timestamp);
            PyTuple_SET_ITEM(item, 2, record.key);
            PyTuple_SET_ITEM(item, 3, record.value);
            PyTuple_SET_ITEM(item, 4, record.headers);
        } else {
            if (record.offset < min_offset) {
                Py_DECREF(record.key);
                Py_DECREF(record.value);
                Py_DECREF(record.headers);
                continue;
            }
            item = cls->tp_alloc(cls, 7);
            if (item == NULL)
                goto fail_record;
            PyObject *offset = PyLong_FromLongLong(record.offset);
            PyObject *timestamp;
            if (fixed_timestamp != NULL) {
                timestamp = fixed_timestamp;
                Py_INCREF(timestamp);
            } else {
                timestamp = PyLong_FromLongLong(record.timestamp);
            }
            if (offset == NULL || timestamp == NULL) {
                Py_XDECREF(offset);
                Py_XDECREF(timestamp);
                Py_DECREF(item);
                goto fail_record;
            }
            Py_INCREF(topic);
            Py_INCREF(partition);
            PyTuple_SET_ITEM(item, 0, topic);
            PyTuple_SET_ITEM(item, 1, partition);
            PyTuple_SET_ITEM(item, 2, offset);
            PyTuple_SET_ITEM(item, 3, record.key);
            PyTuple_SET_ITEM(item, 4, record.value);
            PyTuple_SET_ITEM(item, 5, record.headers);
            PyTuple_SET_ITEM(item, 6, timestamp);
        }
        /* A decoded record holds only immutable atoms (str, int, bytes, None) and untracked
         * header tuples, so it can never be part of a reference cycle: untrack it, as CPython's
         * collector itself untracks such tuples (_PyTuple_MaybeUntrack), but at once. Tracked,
         * every record of a fetch was traversed by the young collections its own allocations
         * triggered: ~0.7 us a record of CPU time against ~0.27 us untracked (20,000-record
         * batches, bench/RESULTS.md section spark). Not for a cls whose instances have a
         * __dict__ (tuple subclasses cannot have other slots). */
        if (cls == NULL || cls->tp_dictoffset == 0)
            PyObject_GC_UnTrack(item);
        if (PyList_Append(out, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        continue;
    fail_record:
        Py_XDECREF(record.key);
        Py_XDECREF(record.value);
        Py_XDECREF(record.headers);
        goto fail;
    }
    if (pos != end) {
        *rejected = 1;
        goto fail;
    }
    PyBuffer_Release(&view);
    return out;
fail:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
decode_record_tuples(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "decode_record_tuples() takes 5 arguments (data, base_offset, "
                     "base_timestamp, record_count, last_offset_delta), %zd given", nargs);
        return NULL;
    }
    int rejected;
    PyObject *out = decode_section(args[0], args[1], args[2], args[3], args[4], NULL, NULL, NULL,
                                   NULL, NULL, &rejected);
    if (out == NULL && rejected)
        return python_decoder("py_decode_record_tuples", args, nargs, 0);
    return out;
}

static PyObject *
decode_records_as(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError,
                     "decode_records_as() takes 10 arguments (cls, data, base_offset, "
                     "base_timestamp, record_count, last_offset_delta, min_offset, topic, "
                     "partition, fixed_timestamp), %zd given", nargs);
        return NULL;
    }
    PyObject *cls = args[0];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_records_as(): cls must be a tuple subclass");
        return NULL;
    }
    PyObject *fixed = args[9] == Py_None ? NULL : args[9];
    if (fixed != NULL && !PyLong_Check(fixed)) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_records_as(): fixed_timestamp must be int or None");
        return NULL;
    }
    int rejected;
    PyObject *out = decode_section(args[1], args[2], args[3], args[4], args[5],
                                   (PyTypeObject *)cls, args[6], args[7], args[8], fixed,
                                   &rejected);
    if (out == NULL && rejected)
        return python_decoder("py_decode_records_as", args, nargs, 1);
    return out;
}

/* ---------------------------------------------------------------- columns in Arrow's layout */

/* The records' field ``index`` must be a list of tuples (ConsumerRecords) whose field at
 * ``index`` is bytes or None; NULL with TypeError otherwise. */
static int
check_records(PyObject *records, PyObject *index_obj, Py_ssize_t *index, const char *what)
{
    if (!PyList_Check(records)) {
        PyErr_Format(PyExc_TypeError, "%s(): records must be a list", what);
        return -1;
    }
    *index = PyLong_AsSsize_t(index_obj);
    if (*index == -1 && PyErr_Occurred())
        return -1;
    if (*index < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): index must be >= 0", what);
        return -1;
    }
    return 0;
}

static PyObject *
field_of(PyObject *record, Py_ssize_t index, const char *what)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) <= index) {
        PyErr_Format(PyExc_TypeError, "%s(): every record must be a tuple with a field %zd",
                     what, index);
        return NULL;
    }
    return PyTuple_GET_ITEM(record, index);
}

/* binary_column(records, index) -> (offsets, data, validity, null_count): field ``index`` of
 * every record (bytes or None) as one Arrow binary column: int32 offsets (len(records) + 1 of
 * them, native byte order), the bytes back to back, and the validity bitmap (bit i set: row i
 * is not null; None when no row is null). OverflowError past 2 GiB of data (int32 offsets). */
static PyObject *
binary_column(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *what = "binary_column";
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "binary_column() takes 2 arguments (records, index), "
                     "%zd given", nargs);
        return NULL;
    }
    PyObject *records = args[0];
    Py_ssize_t index;
    if (check_records(records, args[1], &index, what) < 0)
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(records);
    long long total = 0;
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *field = field_of(PyList_GET_ITEM(records, i), index, what);
        if (field == NULL)
            return NULL;
        if (field == Py_None) {
            nulls++;
        } else if (PyBytes_CheckExact(field)) {
            total += PyBytes_GET_SIZE(field);
        } else {
            PyErr_Format(PyExc_TypeError, "%s(): field %zd of record %zd is %.100s, not bytes "
                         "or None", what, index, i, Py_TYPE(field)->tp_name);
            return NULL;
        }
    }
    if (total > INT32_MAX_VALUE) {
        PyErr_Format(PyExc_OverflowError, "%s(): %lld bytes do not fit int32 offsets", what,
                     total);
        return NULL;
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    PyObject *validity = NULL;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (count + 7) / 8);
        if (validity != NULL)
            memset(PyBytes_AS_STRING(validity), 0, (count + 7) / 8);
    }
    if (offsets == NULL || data == NULL || (nulls && validity == NULL)) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(validity);
        return NULL;
    }
    int32_t *out_offsets = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    unsigned char *bits = nulls ? (unsigned char *)PyBytes_AS_STRING(validity) : NULL;
    int32_t position = 0;
    out_offsets[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *field = PyTuple_GET_ITEM(PyList_GET_ITEM(records, i), index);
        if (field != Py_None) {
            Py_ssize_t size = PyBytes_GET_SIZE(field);
            memcpy(out + position, PyBytes_AS_STRING(field), (size_t)size);
            position += (int32_t)size;
            if (bits != NULL)
                bits[i >> 3] |= (unsigned char)(1u << (i & 7));
        }
        out_offsets[i + 1] = position;
    }
    if (validity == NULL) {
        validity = Py_None;
        Py_INCREF(validity);
    }
    return Py_BuildValue("(NNNn)", offsets, data, validity, nulls);
}

/* int64_column(records, index, multiplier) -> bytes: field ``index`` of every record (an int)
 * times ``multiplier``, as int64s in native byte order (an Arrow int64 or timestamp column's
 * values). OverflowError when a product leaves int64. */
static PyObject *
int64_column(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *what = "int64_column";
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "int64_column() takes 3 arguments (records, index, "
                     "multiplier), %zd given", nargs);
        return NULL;
    }
    PyObject *records = args[0];
    Py_ssize_t index;
    if (check_records(records, args[1], &index, what) < 0)
        return NULL;
    long long multiplier = PyLong_AsLongLong(args[2]);
    if (multiplier == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(records);
    PyObject *column = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (column == NULL)
        return NULL;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(column);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *field = field_of(PyList_GET_ITEM(records, i), index, what);
        if (field == NULL)
            goto fail;
        if (!PyLong_Check(field)) {
            PyErr_Format(PyExc_TypeError, "%s(): field %zd of record %zd is %.100s, not int",
                         what, index, i, Py_TYPE(field)->tp_name);
            goto fail;
        }
        long long value = PyLong_AsLongLong(field);
        if (value == -1 && PyErr_Occurred())
            goto fail;
        long long product;
        if (__builtin_mul_overflow(value, multiplier, &product)) {
            PyErr_Format(PyExc_OverflowError, "%s(): %lld * %lld leaves int64", what, value,
                         multiplier);
            goto fail;
        }
        out[i] = (int64_t)product;
    }
    return column;
fail:
    Py_DECREF(column);
    return NULL;
}

/* ---------------------------------------------------------------- records straight into columns */

/* A growing buffer of bytes (PyMem). */
typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
} Growable;

static int
growable_reserve(Growable *g, Py_ssize_t more)
{
    if (g->len + more <= g->cap)
        return 0;
    Py_ssize_t cap = g->cap ? g->cap : 4096;
    while (cap < g->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *buf = PyMem_Realloc(g->buf, (size_t)cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->buf = buf;
    g->cap = cap;
    return 0;
}

/* One binary column: int32 offsets (rows + 1 once a row was added), the bytes, the validity
 * bitmap (kept for every row; handed out only when a row is null). */
typedef struct {
    Growable offsets;
    Growable data;
    Growable bits;
    Py_ssize_t nulls;
} BinaryColumn;

/* Where a ColumnBuilder stood before an append: restored when the append is rejected. */
typedef struct {
    Py_ssize_t rows, key_data, key_nulls, value_data, value_nulls;
} ColumnMark;

typedef struct {
    PyObject_HEAD
    BinaryColumn keys;
    BinaryColumn values;
    Growable offsets;     /* int64 */
    Growable timestamps;  /* int64, times multiplier */
    Py_ssize_t rows;
    int64_t multiplier;
} ColumnBuilder;

static void
column_builder_free_buffers(ColumnBuilder *self)
{
    Growable *all[] = {&self->keys.offsets, &self->keys.data, &self->keys.bits,
                       &self->values.offsets, &self->values.data, &self->values.bits,
                       &self->offsets, &self->timestamps};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        PyMem_Free(all[i]->buf);
        all[i]->buf = NULL;
        all[i]->len = all[i]->cap = 0;
    }
    self->keys.nulls = self->values.nulls = 0;
    self->rows = 0;
}

static int
ColumnBuilder_init(ColumnBuilder *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"timestamp_multiplier", NULL};
    long long multiplier = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L", kwlist, &multiplier))
        return -1;
    column_builder_free_buffers(self);
    self->multiplier = multiplier;
    return 0;
}

static void
ColumnBuilder_dealloc(ColumnBuilder *self)
{
    column_builder_free_buffers(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static ColumnMark
column_mark(ColumnBuilder *self)
{
    ColumnMark mark = {self->rows, self->keys.data.len, self->keys.nulls, self->values.data.len,
                       self->values.nulls};
    return mark;
}

static void
column_set_rows(BinaryColumn *column, Py_ssize_t rows, Py_ssize_t data, Py_ssize_t nulls)
{
    column->offsets.len = rows ? (rows + 1) * (Py_ssize_t)sizeof(int32_t) : 0;
    column->data.len = data;
    column->nulls = nulls;
    column->bits.len = (rows + 7) / 8;
    if (rows & 7)
        column->bits.buf[rows >> 3] &= (char)((1u << (rows & 7)) - 1);
}

static void
column_restore(ColumnBuilder *self, ColumnMark mark)
{
    column_set_rows(&self->keys, mark.rows, mark.key_data, mark.key_nulls);
    column_set_rows(&self->values, mark.rows, mark.value_data, mark.value_nulls);
    self->offsets.len = self->timestamps.len = mark.rows * (Py_ssize_t)sizeof(int64_t);
    self->rows = mark.rows;
}

/* Append one value (NULL: a null) as row ``row`` of ``column``. -1 with an exception set
 * (OverflowError past int32 offsets, MemoryError). */
static int
column_append(BinaryColumn *column, Py_ssize_t row, const char *data, Py_ssize_t size)
{
    if (row == 0) {
        if (growable_reserve(&column->offsets, sizeof(int32_t)) < 0)
            return -1;
        ((int32_t *)column->offsets.buf)[0] = 0;
        column->offsets.len = sizeof(int32_t);
    }
    if (growable_reserve(&column->offsets, sizeof(int32_t)) < 0
        || growable_reserve(&column->bits, 1) < 0)
        return -1;
    if (row % 8 == 0) {
        column->bits.buf[row >> 3] = 0;
        column->bits.len = (row >> 3) + 1;
    }
    if (data == NULL) {
        column->nulls++;
    } else {
        if (column->data.len + size > INT32_MAX_VALUE) {
            PyErr_Format(PyExc_OverflowError, "ColumnBuilder: more than %lld bytes in a "
                         "column do not fit int32 offsets", INT32_MAX_VALUE);
            return -1;
        }
        if (growable_reserve(&column->data, size) < 0)
            return -1;
        memcpy(column->data.buf + column->data.len, data, (size_t)size);
        column->data.len += size;
        column->bits.buf[row >> 3] |= (char)(1u << (row & 7));
    }
    ((int32_t *)column->offsets.buf)[row + 1] = (int32_t)column->data.len;
    column->offsets.len += sizeof(int32_t);
    return 0;
}

/* Append a row. -1 with an exception set; the builder is then restored by the caller. */
static int
column_builder_add(ColumnBuilder *self, int64_t offset, int64_t timestamp, const char *key,
                   Py_ssize_t key_size, const char *value, Py_ssize_t value_size)
{
    int64_t scaled;
    if (__builtin_mul_overflow(timestamp, self->multiplier, &scaled)) {
        PyErr_Format(PyExc_OverflowError, "ColumnBuilder: timestamp %lld * %lld leaves int64",
                     (long long)timestamp, (long long)self->multiplier);
        return -1;
    }
    Py_ssize_t row = self->rows;
    if (column_append(&self->keys, row, key, key_size) < 0
        || column_append(&self->values, row, value, value_size) < 0
        || growable_reserve(&self->offsets, sizeof(int64_t)) < 0
        || growable_reserve(&self->timestamps, sizeof(int64_t)) < 0)
        return -1;
    ((int64_t *)self->offsets.buf)[row] = offset;
    ((int64_t *)self->timestamps.buf)[row] = scaled;
    self->offsets.len += sizeof(int64_t);
    self->timestamps.len += sizeof(int64_t);
    self->rows = row + 1;
    return 0;
}

/* A length-prefixed byte string at data[*pos] (-1: null) without copying it. */
static int
scan_bytes(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t record_end,
           const char **out, Py_ssize_t *size)
{
    int64_t length;
    if (get_zigzag(data, pos, record_end, &length) < 0)
        return DECODE_REJECT;
    if (length == -1) {
        *out = NULL;
        *size = 0;
        return DECODE_OK;
    }
    if (length < 0 || length > record_end - *pos)
        return DECODE_REJECT;
    *out = (const char *)data + *pos;
    *size = (Py_ssize_t)length;
    *pos += (Py_ssize_t)length;
    return DECODE_OK;
}

/* ColumnBuilder.append_section(data, base_offset, base_timestamp, record_count,
 * last_offset_delta, min_offset, fixed_timestamp) -> int or None: the section's records at or
 * after min_offset appended; None (nothing appended) when the section holds anything decode_one
 * would not decode itself, or records with headers: the caller then decodes the batch with
 * decode_records_as (which also raises its errors) and appends with append_records. The whole
 * section is checked as decode_records_as checks it; nothing of a rejected section stays. */
static PyObject *
ColumnBuilder_append_section(ColumnBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError,
                     "append_section() takes 7 arguments (data, base_offset, base_timestamp, "
                     "record_count, last_offset_delta, min_offset, fixed_timestamp), %zd given",
                     nargs);
        return NULL;
    }
    int64_t base_offset, base_timestamp, record_count, last_offset_delta, min_offset;
    int64_t fixed_timestamp = 0;
    int fixed = args[6] != Py_None;
    int conv;
    if ((conv = int64_arg(args[1], &base_offset)) != 0
        || (conv = int64_arg(args[2], &base_timestamp)) != 0
        || (conv = int64_arg(args[3], &record_count)) != 0
        || (conv = int64_arg(args[4], &last_offset_delta)) != 0
        || (conv = int64_arg(args[5], &min_offset)) != 0
        || (fixed && (conv = int64_arg(args[6], &fixed_timestamp)) != 0)) {
        if (conv > 0)
            Py_RETURN_NONE;
        return NULL;
    }
    if (record_count < 0)
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    int64_t previous_delta = -1;
    ColumnMark mark = column_mark(self);
    for (int64_t i = 0; i < record_count; i++) {
        int64_t length, timestamp_delta, offset_delta, offset, timestamp;
        const char *key, *value;
        Py_ssize_t key_size, value_size;
        if (get_zigzag(data, &pos, end, &length) < 0 || length < MIN_RECORD_BODY
            || length > end - pos)
            goto reject;
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        if (data[pos] != 0)  /* attributes */
            goto reject;
        pos += 1;
        if (get_zigzag(data, &pos, record_end, &timestamp_delta) < 0
            || get_zigzag(data, &pos, record_end, &offset_delta) < 0
            || offset_delta <= previous_delta || offset_delta > last_offset_delta)
            goto reject;
        previous_delta = offset_delta;
        if (__builtin_add_overflow(base_offset, offset_delta, &offset)
            || __builtin_add_overflow(base_timestamp, timestamp_delta, &timestamp))
            goto reject;
        if (scan_bytes(data, &pos, record_end, &key, &key_size) != DECODE_OK
            || scan_bytes(data, &pos, record_end, &value, &value_size) != DECODE_OK)
            goto reject;
        /* No headers (one 0 byte, the record's last); anything else goes the records' way. */
        if (pos + 1 != record_end || data[pos] != 0)
            goto reject;
        pos = record_end;
        if (offset < min_offset)
            continue;
        if (column_builder_add(self, offset, fixed ? fixed_timestamp : timestamp, key, key_size,
                               value, value_size) < 0)
            goto fail;
    }
    if (pos != end)
        goto reject;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(self->rows - mark.rows);
reject:
    PyBuffer_Release(&view);
    column_restore(self, mark);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    column_restore(self, mark);
    return NULL;
}

/* ColumnBuilder.append_records(records) -> int: ConsumerRecord-shaped tuples (topic, partition,
 * offset, key, value, headers, timestamp) appended (headers are not kept). TypeError for a
 * record of another shape; nothing of a failed call stays. */
static PyObject *
ColumnBuilder_append_records(ColumnBuilder *self, PyObject *records)
{
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "append_records(): records must be a list");
        return NULL;
    }
    ColumnMark mark = column_mark(self);
    Py_ssize_t count = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != 7) {
            PyErr_Format(PyExc_TypeError, "append_records(): record %zd is not a 7-field "
                         "ConsumerRecord", i);
            goto fail;
        }
        PyObject *fields[2] = {PyTuple_GET_ITEM(record, 3), PyTuple_GET_ITEM(record, 4)};
        const char *spans[2];
        Py_ssize_t sizes[2];
        for (int f = 0; f < 2; f++) {
            if (fields[f] == Py_None) {
                spans[f] = NULL;
                sizes[f] = 0;
            } else if (PyBytes_CheckExact(fields[f])) {
                spans[f] = PyBytes_AS_STRING(fields[f]);
                sizes[f] = PyBytes_GET_SIZE(fields[f]);
            } else {
                PyErr_Format(PyExc_TypeError, "append_records(): the %s of record %zd is "
                             "%.100s, not bytes or None", f ? "value" : "key", i,
                             Py_TYPE(fields[f])->tp_name);
                goto fail;
            }
        }
        int64_t offset, timestamp;
        if (int64_arg(PyTuple_GET_ITEM(record, 2), &offset) != 0
            || int64_arg(PyTuple_GET_ITEM(record, 6), &timestamp) != 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_OverflowError, "append_records(): the offset or timestamp "
                             "of record %zd leaves int64", i);
            goto fail;
        }
        if (column_builder_add(self, offset, timestamp, spans[0], sizes[0], spans[1],
                               sizes[1]) < 0)
            goto fail;
    }
    return PyLong_FromSsize_t(count);
fail:
    column_restore(self, mark);
    return NULL;
}

static PyObject *
growable_take(Growable *g)
{
    return PyBytes_FromStringAndSize(g->buf ? g->buf : "", g->len);
}

static PyObject *
binary_take(BinaryColumn *column, Py_ssize_t rows)
{
    PyObject *offsets = rows ? growable_take(&column->offsets)
                             : PyBytes_FromStringAndSize("\0\0\0\0", 4);
    PyObject *data = growable_take(&column->data);
    PyObject *bits;
    if (column->nulls) {
        bits = growable_take(&column->bits);
    } else {
        bits = Py_None;
        Py_INCREF(bits);
    }
    if (offsets == NULL || data == NULL || bits == NULL) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(bits);
        return NULL;
    }
    return Py_BuildValue("(NNNn)", offsets, data, bits, column->nulls);
}

/* ColumnBuilder.take() -> (rows, keys, values, offsets, timestamps): the rows appended so far,
 * keys and values as binary_column() answers them, offsets and timestamps as int64_column();
 * the builder is empty again afterwards. */
static PyObject *
ColumnBuilder_take(ColumnBuilder *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t rows = self->rows;
    PyObject *keys = binary_take(&self->keys, rows);
    PyObject *values = binary_take(&self->values, rows);
    PyObject *offsets = growable_take(&self->offsets);
    PyObject *timestamps = growable_take(&self->timestamps);
    if (keys == NULL || values == NULL || offsets == NULL || timestamps == NULL) {
        Py_XDECREF(keys);
        Py_XDECREF(values);
        Py_XDECREF(offsets);
        Py_XDECREF(timestamps);
        return NULL;
    }
    /* Keep the buffers' capacity for the next rows: only the lengths go back to 0. */
    ColumnMark empty = {0, 0, 0, 0, 0};
    column_restore(self, empty);
    return Py_BuildValue("(nNNNN)", rows, keys, values, offsets, timestamps);
}

static PyObject *
ColumnBuilder_get_rows(ColumnBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *
ColumnBuilder_get_data_bytes(ColumnBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->keys.data.len + self->values.data.len);
}

static PyMethodDef ColumnBuilder_methods[] = {
    {"append_section", (PyCFunction)(void (*)(void))ColumnBuilder_append_section, METH_FASTCALL,
     "append_section(data, base_offset, base_timestamp, record_count, last_offset_delta, "
     "min_offset, fixed_timestamp) -> int or None: the records at or after min_offset of a "
     "records section appended (None, appending nothing: decode it with decode_records_as "
     "and use append_records; records with headers and every malformed section go there)."},
    {"append_records", (PyCFunction)ColumnBuilder_append_records, METH_O,
     "append_records(records) -> int: ConsumerRecord tuples appended (headers not kept)."},
    {"take", (PyCFunction)ColumnBuilder_take, METH_NOARGS,
     "take() -> (rows, keys, values, offsets, timestamps): keys and values as "
     "binary_column()'s (offsets, data, validity or None, null_count), offsets and "
     "timestamps (times timestamp_multiplier) as native int64 bytes; empties the builder."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ColumnBuilder_getset[] = {
    {"rows", (getter)ColumnBuilder_get_rows, NULL, "Rows appended since the last take().", NULL},
    {"data_bytes", (getter)ColumnBuilder_get_data_bytes, NULL,
     "Bytes of keys and values appended since the last take().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ColumnBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fjord.records._speedups.ColumnBuilder",
    .tp_doc = "ColumnBuilder(timestamp_multiplier=1): records of one partition decoded "
              "straight into the buffers of Arrow columns (key, value, offset, timestamp), "
              "with no Python object per record (the Spark source's read tasks).",
    .tp_basicsize = sizeof(ColumnBuilder),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ColumnBuilder_init,
    .tp_dealloc = (destructor)ColumnBuilder_dealloc,
    .tp_methods = ColumnBuilder_methods,
    .tp_getset = ColumnBuilder_getset,
};

/* ---------------------------------------------------------------- keyed partitioning */

/* Kafka's Utils.murmur2 (the Java client's keyed partitioner), as uint32. */
static uint32_t
kafka_murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8)
            | ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* murmur2(data: bytes) -> int: as fjord.client.partitioner.py_murmur2. */
static PyObject *
murmur2(PyObject *Py_UNUSED(module), PyObject *data)
{
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "murmur2() needs bytes, got %.100s",
                     Py_TYPE(data)->tp_name);
        return NULL;
    }
    return PyLong_FromUnsignedLong(
        kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)));
}

/* group_by_partition(keys, values, num_partitions, null_key_partition)
 *     -> [(keys, values) or None per partition]
 * Each record (keys[i], values[i]) goes to Kafka's keyed partition of its key
 * (toPositive(murmur2(key)) % num_partitions), a record with a None key to
 * null_key_partition; the order of records within a partition is kept. Keys: bytes or None. */
static PyObject *
group_by_partition(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "group_by_partition() takes 4 arguments (keys, values, "
                     "num_partitions, null_key_partition), %zd given", nargs);
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    if (!PyList_Check(keys) || !PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "group_by_partition(): keys and values must be lists");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != count) {
        PyErr_SetString(PyExc_ValueError, "group_by_partition(): keys and values differ in "
                        "length");
        return NULL;
    }
    Py_ssize_t partitions = PyLong_AsSsize_t(args[2]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t null_partition = PyLong_AsSsize_t(args[3]);
    if (null_partition == -1 && PyErr_Occurred())
        return NULL;
    if (partitions < 1 || null_partition < 0 || null_partition >= partitions) {
        PyErr_SetString(PyExc_ValueError, "group_by_partition(): need num_partitions >= 1 and "
                        "0 <= null_key_partition < num_partitions");
        return NULL;
    }
    PyObject *groups = PyList_New(partitions);
    if (groups == NULL)
        return NULL;
    for (Py_ssize_t p = 0; p < partitions; p++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(groups, p, Py_None);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t p;
        if (key == Py_None) {
            p = null_partition;
        } else if (PyBytes_Check(key)) {
            uint32_t h = kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(key),
                                       PyBytes_GET_SIZE(key));
            p = (Py_ssize_t)((h & 0x7fffffffu) % (uint32_t)partitions);
        } else {
            PyErr_Format(PyExc_TypeError, "group_by_partition(): key %zd is %.100s, not bytes "
                         "or None", i, Py_TYPE(key)->tp_name);
            goto fail;
        }
        PyObject *group = PyList_GET_ITEM(groups, p);
        if (group == Py_None) {
            group = Py_BuildValue("(NN)", PyList_New(0), PyList_New(0));
            if (group == NULL)
                goto fail;
            PyList_SET_ITEM(groups, p, group);
            Py_DECREF(Py_None);
        }
        if (PyList_Append(PyTuple_GET_ITEM(group, 0), key) < 0
            || PyList_Append(PyTuple_GET_ITEM(group, 1), PyList_GET_ITEM(values, i)) < 0)
            goto fail;
    }
    return groups;
fail:
    Py_DECREF(groups);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"decode_record_tuples", (PyCFunction)(void (*)(void))decode_record_tuples, METH_FASTCALL,
     "decode_record_tuples(data, base_offset, base_timestamp, record_count, last_offset_delta)"
     " -> list of (offset, timestamp, key, value, headers); as "
     "fjord.records.reader.py_decode_record_tuples."},
    {"decode_records_as", (PyCFunction)(void (*)(void))decode_records_as, METH_FASTCALL,
     "decode_records_as(cls, data, base_offset, base_timestamp, record_count, "
     "last_offset_delta, min_offset, topic, partition, fixed_timestamp) -> list of "
     "cls(topic, partition, offset, key, value, headers, timestamp); as "
     "fjord.records.reader.py_decode_records_as."},
    {"binary_column", (PyCFunction)(void (*)(void))binary_column, METH_FASTCALL,
     "binary_column(records, index) -> (offsets, data, validity or None, null_count): field "
     "index (bytes or None) of a list of tuples as an Arrow binary column's buffers."},
    {"int64_column", (PyCFunction)(void (*)(void))int64_column, METH_FASTCALL,
     "int64_column(records, index, multiplier) -> bytes: field index (int) of a list of "
     "tuples, times multiplier, as native int64s (an Arrow int64 column's values)."},
    {"murmur2", (PyCFunction)murmur2, METH_O,
     "murmur2(data: bytes) -> int: Kafka's murmur2 (unsigned 32-bit); as "
     "fjord.client.partitioner.py_murmur2."},
    {"group_by_partition", (PyCFunction)(void (*)(void))group_by_partition, METH_FASTCALL,
     "group_by_partition(keys, values, num_partitions, null_key_partition) -> list of "
     "(keys, values) or None per partition: Kafka's keyed partitioner over lists of records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fjord.records._speedups",
    .m_doc = "RecordBatch v2 hot loops in C; fjord.records.builder / reader are the reference.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&AppenderType) < 0 || PyType_Ready(&FutureBaseType) < 0
        || PyType_Ready(&ColumnBuilderType) < 0 || PyType_Ready(&FastSendType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(module, "RecordAppender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&FutureBaseType);
    if (PyModule_AddObject(module, "RecordFutureBase", (PyObject *)&FutureBaseType) < 0) {
        Py_DECREF(&FutureBaseType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&ColumnBuilderType);
    if (PyModule_AddObject(module, "ColumnBuilder", (PyObject *)&ColumnBuilderType) < 0) {
        Py_DECREF(&ColumnBuilderType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&FastSendType);
    if (PyModule_AddObject(module, "FastSend", (PyObject *)&FastSendType) < 0) {
        Py_DECREF(&FastSendType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
