/*
 * _elvin_xdr: the optional compiled decoder for an XDR NameValue array,
 * the hot path of every notification. elvin/protocols/xdr.py's
 * Reader.name_values uses it when it was built (pip install .) and keeps
 * its pure-Python path otherwise. Beside it, the subscription index's
 * grid-cell filter and the packing of its bounds (cell_select,
 * pack_bounds: elvin/core/index.py, which keeps pure-Python ones too).
 *
 * It only decodes what is well formed: on anything else (truncation, a
 * negative or impossible count, bad UTF-8 or a NUL byte in a string, a
 * repeated name, an unknown typecode) it returns None and the pure-Python path decodes the same
 * bytes again, raising the DecodeError with its exact message and offset.
 * So errors stay defined in one place, and the two paths cannot disagree
 * on a well-formed packet: the codec tests and a property test run both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ABI_VERSION 5

enum { T_INT32 = 1, T_INT64 = 2, T_REAL64 = 3, T_STRING = 4, T_OPAQUE = 5 };

static uint32_t
get_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
           ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t
get_u64(const unsigned char *p)
{
    return ((uint64_t)get_u32(p) << 32) | (uint64_t)get_u32(p + 4);
}

/* Reads a length-prefixed, padded item at *pos; sets *start and *len.
 * Returns 0 when it does not fit before end or its padding is not zero. */
static int
take_block(Py_ssize_t *pos, Py_ssize_t end, const unsigned char *buf,
           Py_ssize_t *start, Py_ssize_t *len)
{
    if (*pos + 4 > end)
        return 0;
    uint32_t n = get_u32(buf + *pos);
    Py_ssize_t s = *pos + 4;
    if ((uint64_t)n > (uint64_t)(end - s))
        return 0;
    Py_ssize_t stop = s + (Py_ssize_t)n;
    Py_ssize_t padded = stop + ((-(Py_ssize_t)n) & 3);
    if (padded > end)
        return 0;
    /* Padding must be zero (XDR): an array decoded here is then its own
       canonical encoding, which a router may pass on as it came. Anything
       else is left to the Python decoder. */
    for (Py_ssize_t i = stop; i < padded; i++)
        if (buf[i])
            return 0;
    *start = s;
    *len = (Py_ssize_t)n;
    *pos = padded;
    return 1;
}

/* A string's bytes as a str, or NULL: not UTF-8, or holding a NUL byte,
 * which a string may not (client protocol 6.1.4); for those two no Python
 * error is left set. */
static PyObject *
decode_string(const unsigned char *buf, Py_ssize_t start, Py_ssize_t len)
{
    if (memchr(buf + start, 0, (size_t)len) != NULL)
        return NULL;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)buf + start, len, NULL);
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return text;
}

/* name_values(data, pos, end, int64_type) -> (dict, new_pos) or None */
static PyObject *
name_values(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end;
    PyObject *int64_type;
    PyObject *result = NULL, *dict = NULL;

    if (!PyArg_ParseTuple(args, "y*nnO", &view, &pos, &end, &int64_type))
        return NULL;
    /* An int subclass that keeps int's layout and adds no __new__ of
       substance (values.Int64) is made by int.__new__ directly. */
    int int_subtype = PyType_Check(int64_type)
        && PyType_IsSubtype((PyTypeObject *)int64_type, &PyLong_Type);
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end > view.len || pos < 0 || pos > end)
        goto fallback;
    if (pos + 4 > end)
        goto fallback;
    int32_t count = (int32_t)get_u32(buf + pos);
    pos += 4;
    if (count < 0 || (int64_t)count * 12 > (int64_t)(end - pos))
        goto fallback;
    dict = PyDict_New();
    if (dict == NULL)
        goto error;
    for (int32_t i = 0; i < count; i++) {
        Py_ssize_t start, len;
        if (!take_block(&pos, end, buf, &start, &len))
            goto fallback;
        PyObject *name = decode_string(buf, start, len);
        if (name == NULL) {
            if (PyErr_Occurred())
                goto error;
            goto fallback;
        }
        int present = PyDict_Contains(dict, name);
        if (present != 0) {
            Py_DECREF(name);
            if (present < 0)
                goto error;
            goto fallback;
        }
        if (pos + 4 > end) {
            Py_DECREF(name);
            goto fallback;
        }
        uint32_t code = get_u32(buf + pos);
        pos += 4;
        PyObject *value = NULL;
        switch (code) {
        case T_INT32:
            if (pos + 4 > end)
                break;
            value = PyLong_FromLong((long)(int32_t)get_u32(buf + pos));
            pos += 4;
            break;
        case T_INT64:
            if (pos + 8 > end)
                break;
            {
                PyObject *number = PyLong_FromLongLong((long long)(int64_t)get_u64(buf + pos));
                if (number == NULL) {
                    Py_DECREF(name);
                    goto error;
                }
                if (int_subtype) {
                    /* int.__new__(int64_type, number): the subclass's own
                       __new__ only checks the range, which 8 bytes meet. */
                    PyObject *pair = PyTuple_Pack(1, number);
                    value = pair == NULL ? NULL
                        : PyLong_Type.tp_new((PyTypeObject *)int64_type, pair, NULL);
                    Py_XDECREF(pair);
                } else {
                    value = PyObject_CallOneArg(int64_type, number);
                }
                Py_DECREF(number);
                if (value == NULL) {
                    Py_DECREF(name);
                    goto error;
                }
            }
            pos += 8;
            break;
        case T_REAL64:
            if (pos + 8 > end)
                break;
            {
                uint64_t bits = get_u64(buf + pos);
                double d;
                memcpy(&d, &bits, sizeof d);
                value = PyFloat_FromDouble(d);
            }
            pos += 8;
            break;
        case T_STRING:
            if (!take_block(&pos, end, buf, &start, &len))
                break;
            value = decode_string(buf, start, len);
            break;
        case T_OPAQUE:
            if (!take_block(&pos, end, buf, &start, &len))
                break;
            value = PyBytes_FromStringAndSize((const char *)buf + start, len);
            break;
        default:
            break;
        }
        if (value == NULL) {
            Py_DECREF(name);
            if (PyErr_Occurred())
                goto error;
            goto fallback;
        }
        int failed = PyDict_SetItem(dict, name, value);
        Py_DECREF(name);
        Py_DECREF(value);
        if (failed < 0)
            goto error;
    }
    result = Py_BuildValue("(Nn)", dict, pos);
    PyBuffer_Release(&view);
    return result;

fallback:
    Py_XDECREF(dict);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;

error:
    Py_XDECREF(dict);
    PyBuffer_Release(&view);
    return NULL;
}

/* Append to the list found the entries of the grid cell cells[key] (if
 * any) whose bounds do not exclude the dims values v (v < lo or v > hi
 * excludes; so a NaN is excluded by none). A cell is a tuple: a bytes
 * object of native float32s, (lo, hi) per value for each entry, then the
 * entries in that order (elvin/core/index.py, _Bucket._file). The bounds
 * sit in one object, a cache line or two, not one float object each.
 * Compares as Python compares a float with a float32 made a float.
 * Returns -1 with an error set, else 0. */
static int
select_in_cell(PyObject *cells, PyObject *key, PyObject *found, const double *v,
               Py_ssize_t dims)
{
    PyObject *cell = PyDict_GetItemWithError(cells, key);   /* borrowed */
    if (cell == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t per = 2 * dims;
    PyObject *bounds;
    if (!PyTuple_CheckExact(cell) || PyTuple_GET_SIZE(cell) < 1
            || !PyBytes_CheckExact(bounds = PyTuple_GET_ITEM(cell, 0))
            || PyBytes_GET_SIZE(bounds)
               != (Py_ssize_t)sizeof(float) * per * (PyTuple_GET_SIZE(cell) - 1)) {
        PyErr_SetString(PyExc_TypeError, "cell_select: not a grid cell");
        return -1;
    }
    const char *b = PyBytes_AS_STRING(bounds);
    Py_ssize_t n = PyTuple_GET_SIZE(cell) - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        float d[6];
        memcpy(d, b + i * per * (Py_ssize_t)sizeof(float), (size_t)per * sizeof(float));
        Py_ssize_t k = 0;
        while (k < dims && !(v[k] < (double)d[2 * k] || v[k] > (double)d[2 * k + 1]))
            k++;
        if (k == dims && PyList_Append(found, PyTuple_GET_ITEM(cell, i + 1)) < 0)
            return -1;
    }
    return 0;
}

/* cell_select(cells, key, found, v[, v2[, v3]]): select_in_cell for
 * Python (the values floats). Anything else is a TypeError; the index
 * never passes it. */
static PyObject *
cell_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "cell_select takes 4 to 6 arguments");
        return NULL;
    }
    PyObject *cells = args[0], *found = args[2];
    if (!PyDict_Check(cells) || !PyList_Check(found)) {
        PyErr_SetString(PyExc_TypeError, "cell_select(dict, key, list, float, ...)");
        return NULL;
    }
    Py_ssize_t dims = nargs - 3;
    double v[3];
    for (Py_ssize_t k = 0; k < dims; k++) {
        v[k] = PyFloat_AsDouble(args[3 + k]);
        if (v[k] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    if (select_in_cell(cells, args[1], found, v, dims) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The fields of a bucket's look-up, its "look" (elvin/core/index.py,
 * _Bucket._relook): its entries dict while it has no grid, else this
 * tuple. */
enum { LOOK_CELLS, LOOK_LOOSE, LOOK_ROWS, LOOK_NAME, LOOK_WIDTH, LOOK_NAME2, LOOK_WIDTH2,
       LOOK_NAME3, LOOK_SIZE };

/* Append the values of the dict d to the list found, in order. */
static int
extend_by_values(PyObject *found, PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(d, &pos, &key, &value))
        if (PyList_Append(found, value) < 0)
            return -1;
    return 0;
}

/* Whether value is a number as the index takes one: its class one of the
 * tuple numbers (int, float, Int64: not bool), by identity as Python's
 * "value.__class__ in numbers" finds a class. */
static int
is_number(PyObject *value, PyObject *numbers)
{
    PyObject *cls = (PyObject *)Py_TYPE(value);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(numbers); i++)
        if (PyTuple_GET_ITEM(numbers, i) == cls)
            return 1;
    return 0;
}

/* A number's value as a real64, as Python's "value / 1.0" gives it: -1
 * with an error set (an int past the real64 range). */
static int
as_real(PyObject *value, double *out)
{
    if (PyFloat_Check(value))
        *out = PyFloat_AS_DOUBLE(value);
    else {
        *out = PyLong_AsDouble(value);
        if (*out == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* A cell number (a real64 with no fraction, finite) as a Python int,
 * which math.floor gives. */
static PyObject *
cell_number(double x)
{
    if (x > -9.0e18 && x < 9.0e18)
        return PyLong_FromLongLong((long long)x);
    return PyLong_FromDouble(x);
}

/* The key of the cell x, y in a grid of two attributes: x * 2**32 + y. */
static PyObject *
cell_key(double x, double y)
{
    if (x > -1073741824.0 && x < 1073741824.0 && y > -2147483648.0 && y < 2147483648.0)
        return PyLong_FromLongLong((long long)x * 4294967296LL + (long long)y);
    PyObject *a = cell_number(x), *b = cell_number(y), *stride = NULL, *m = NULL, *key = NULL;
    if (a != NULL && b != NULL && (stride = PyLong_FromLongLong(4294967296LL)) != NULL
            && (m = PyNumber_Multiply(a, stride)) != NULL)
        key = PyNumber_Add(m, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(stride);
    Py_XDECREF(m);
    return key;
}

/* The look-up of one bucket by its look (see LOOK_*): what
 * elvin/core/index.py's _select_bucket_in_python does with the bucket's
 * slots, in the same order, with the same results. */
static int
select_by_look(PyObject *look, PyObject *attributes, PyObject *found, PyObject *numbers)
{
    if (PyDict_CheckExact(look))
        return extend_by_values(found, look);
    if (!PyTuple_CheckExact(look) || PyTuple_GET_SIZE(look) != LOOK_SIZE
            || !PyDict_CheckExact(PyTuple_GET_ITEM(look, LOOK_CELLS))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(look, LOOK_WIDTH))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(look, LOOK_WIDTH2))) {
        PyErr_SetString(PyExc_TypeError, "bucket_select: not a bucket's look");
        return -1;
    }
    PyObject *cells = PyTuple_GET_ITEM(look, LOOK_CELLS);
    PyObject *loose = PyTuple_GET_ITEM(look, LOOK_LOOSE);
    if (loose != Py_None && extend_by_values(found, loose) < 0)
        return -1;
    PyObject *value = PyDict_GetItemWithError(attributes, PyTuple_GET_ITEM(look, LOOK_NAME));
    if (value == NULL)
        return PyErr_Occurred() ? -1 : 0;
    /* Only a finite number can satisfy a bound. */
    double v[3];
    if (!is_number(value, numbers) || as_real(value, &v[0]) < 0 || !isfinite(v[0]))
        return PyErr_Occurred() ? -1 : 0;
    /* The value in cells, compared with bounds in cells (_Bucket._place);
       one too large for a cell number has none, nor any entry there. */
    v[0] /= PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(look, LOOK_WIDTH));
    if (!isfinite(v[0]))
        return 0;
    double x = floor(v[0]);
    Py_ssize_t dims = 1;
    PyObject *name2 = PyTuple_GET_ITEM(look, LOOK_NAME2);
    PyObject *name3 = PyTuple_GET_ITEM(look, LOOK_NAME3);
    double v3 = NAN;
    if (name3 != Py_None) {
        /* A real64 (rounding never reverses an order); NaN for anything
           else, which no bound excludes. */
        PyObject *third = PyDict_GetItemWithError(attributes, name3);
        if (third == NULL && PyErr_Occurred())
            return -1;
        if (third != NULL && is_number(third, numbers) && as_real(third, &v3) < 0)
            return -1;
    }
    PyObject *key;
    if (name2 == Py_None) {
        key = cell_number(x);
    }
    else {
        PyObject *rows = PyTuple_GET_ITEM(look, LOOK_ROWS);
        if (rows != Py_None) {
            if (!PyDict_CheckExact(rows)) {
                PyErr_SetString(PyExc_TypeError, "bucket_select: not a bucket's look");
                return -1;
            }
            PyObject *xkey = cell_number(x);
            if (xkey == NULL)
                return -1;
            PyObject *row = PyDict_GetItemWithError(rows, xkey);
            Py_DECREF(xkey);
            if (row == NULL && PyErr_Occurred())
                return -1;
            if (row != NULL && PyList_CheckExact(row) && PyList_GET_SIZE(row)
                    && PyList_SetSlice(found, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, row) < 0)
                return -1;
        }
        value = PyDict_GetItemWithError(attributes, name2);
        if (value == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if (!is_number(value, numbers) || as_real(value, &v[1]) < 0 || !isfinite(v[1]))
            return PyErr_Occurred() ? -1 : 0;
        v[1] /= PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(look, LOOK_WIDTH2));
        if (!isfinite(v[1]))
            return 0;
        dims = 2;
        key = cell_key(x, floor(v[1]));
    }
    if (key == NULL)
        return -1;
    if (name3 != Py_None)
        v[dims++] = v3;
    int result = select_in_cell(cells, key, found, v, dims);
    Py_DECREF(key);
    return result;
}

static int
check_select_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t wanted,
                  const char *message)
{
    if (nargs != wanted || !PyDict_CheckExact(args[1]) || !PyList_CheckExact(args[2])
            || !PyTuple_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, message);
        return -1;
    }
    return 0;
}

static PyObject *look_name;     /* "look", interned */

/* bucket_select(bucket, attributes, found, numbers): append to the list
 * found the entries of the bucket (its "look") that the dict attributes
 * may match (elvin/core/index.py, _select_bucket). */
static PyObject *
bucket_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_select_args(args, nargs, 4,
                          "bucket_select(bucket, dict, list, tuple of classes)") < 0)
        return NULL;
    PyObject *look = PyObject_GetAttr(args[0], look_name);
    if (look == NULL)
        return NULL;
    int result = select_by_look(look, args[1], args[2], args[3]);
    Py_DECREF(look);
    if (result < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* values_select(by_values, attributes, found, numbers, key): for each
 * names signature and its table of buckets in the dict by_values, the
 * bucket the dict attributes select (their values under the signature's
 * names: a tuple of them when one or two are all strings, else
 * key(signature, attributes), None for none), its entries they may match
 * appended to found (elvin/core/index.py, _select_by_values). */
static PyObject *
values_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_select_args(args, nargs, 5,
                          "values_select(dict, dict, list, tuple of classes, key)") < 0
            || !PyDict_CheckExact(args[0])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "values_select(dict, dict, list, tuple of classes, key)");
        return NULL;
    }
    PyObject *by_values = args[0], *attributes = args[1], *found = args[2];
    PyObject *numbers = args[3], *key_of = args[4];
    Py_ssize_t pos = 0;
    PyObject *signature, *table;
    while (PyDict_Next(by_values, &pos, &signature, &table)) {
        if (!PyTuple_CheckExact(signature) || !PyDict_CheckExact(table)) {
            PyErr_SetString(PyExc_TypeError, "values_select: not a table of buckets");
            return NULL;
        }
        Py_ssize_t size = PyTuple_GET_SIZE(signature);
        PyObject *key = NULL;
        if (size == 1 || size == 2) {
            PyObject *values[2];
            Py_ssize_t i = 0;
            for (; i < size; i++) {
                values[i] = PyDict_GetItemWithError(attributes,
                                                    PyTuple_GET_ITEM(signature, i));
                if (values[i] == NULL && PyErr_Occurred())
                    return NULL;
                if (values[i] == NULL || !PyUnicode_CheckExact(values[i]))
                    break;
            }
            if (i < size && values[i] == NULL)
                continue;   /* a name missing: no key (as key() says) */
            if (i == size) {
                /* a string is its own key */
                key = size == 1 ? PyTuple_Pack(1, values[0])
                    : PyTuple_Pack(2, values[0], values[1]);
                if (key == NULL)
                    return NULL;
            }
        }
        if (key == NULL) {
            /* held while Python code runs */
            Py_INCREF(signature);
            Py_INCREF(table);
            PyObject *call[2] = {signature, attributes};
            key = PyObject_Vectorcall(key_of, call, 2, NULL);
            Py_DECREF(signature);
            if (key == NULL || key == Py_None) {
                Py_DECREF(table);
                if (key == NULL)
                    return NULL;
                Py_DECREF(key);
                continue;
            }
            Py_DECREF(table);   /* still held by by_values, which key() does not change */
        }
        PyObject *bucket = PyDict_GetItemWithError(table, key);
        Py_DECREF(key);
        if (bucket == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        PyObject *look = PyObject_GetAttr(bucket, look_name);
        if (look == NULL)
            return NULL;
        int result = select_by_look(look, attributes, found, numbers);
        Py_DECREF(look);
        if (result < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* A double rounded to the nearest float32 at or below it (down) or at or
 * above it (up); past the float32 range, the largest float32 or an
 * infinity. elvin/core/index.py's _outward does the same in Python. */
static float
outward(double x, int up)
{
    if (up) {
        if (x > FLT_MAX)
            return INFINITY;
        if (x < -FLT_MAX)
            return x == -INFINITY ? -INFINITY : -FLT_MAX;
    }
    else {
        if (x < -FLT_MAX)
            return -INFINITY;
        if (x > FLT_MAX)
            return x == INFINITY ? INFINITY : FLT_MAX;
    }
    float f = (float)x;
    if (up ? (double)f < x : (double)f > x)
        f = nextafterf(f, up ? INFINITY : -INFINITY);
    return f;
}

/* pack_bounds(lo, hi, ...): an entry's bounds in a grid cell (pairs of
 * floats, not NaN), as native float32s rounded outward, in bytes
 * (elvin/core/index.py, _pack_bounds). */
static PyObject *
pack_bounds(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs % 2 || nargs > 16) {
        PyErr_SetString(PyExc_TypeError, "pack_bounds takes pairs of bounds (at most 8)");
        return NULL;
    }
    float out[16];
    for (Py_ssize_t i = 0; i < nargs; i++) {
        double x = PyFloat_AsDouble(args[i]);
        if (x == -1.0 && PyErr_Occurred())
            return NULL;
        if (isnan(x)) {
            PyErr_SetString(PyExc_ValueError, "pack_bounds: a bound is NaN");
            return NULL;
        }
        out[i] = outward(x, (int)(i % 2));
    }
    return PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)(nargs * sizeof(float)));
}

static PyMethodDef methods[] = {
    {"pack_bounds", (PyCFunction)(void (*)(void))pack_bounds, METH_FASTCALL,
     "pack_bounds(lo, hi, ...): the bounds as native float32s rounded outward, "
     "in bytes (elvin/core/index.py)."},
    {"bucket_select", (PyCFunction)(void (*)(void))bucket_select, METH_FASTCALL,
     "bucket_select(bucket, attributes, found, numbers): append to found the "
     "entries of the bucket that attributes may match (elvin/core/index.py)."},
    {"values_select", (PyCFunction)(void (*)(void))values_select, METH_FASTCALL,
     "values_select(by_values, attributes, found, numbers, key): append to found "
     "the entries of the buckets by values that attributes select and may match "
     "(elvin/core/index.py)."},
    {"cell_select", (PyCFunction)(void (*)(void))cell_select, METH_FASTCALL,
     "cell_select(cells, key, found, v[, v2[, v3]]): append to found the entries "
     "of the grid cell cells[key] whose bounds do not exclude the values "
     "(elvin/core/index.py)."},
    {"name_values", name_values, METH_VARARGS,
     "name_values(data, pos, end, int64_type) -> (dict, new_pos), or None when "
     "the bytes are not a well-formed NameValue array (the caller then decodes "
     "them in Python, which names the error)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_elvin_xdr",
    "Optional compiled XDR decoding for elvin (see elvin/protocols/xdr.py).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__elvin_xdr(void)
{
    if (look_name == NULL && (look_name = PyUnicode_InternFromString("look")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", ABI_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
