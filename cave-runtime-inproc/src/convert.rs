//! `Value` to Python objects and back.

use cave_core::Value;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString,
    PyTuple,
};

/// Nesting deeper than this is refused (it is almost surely a cycle).
const MAX_DEPTH: usize = 512;

/// A Python object that has no `Value` counterpart.
#[derive(Debug)]
pub(crate) enum FromPyError {
    /// Its type, as Python names it (e.g. `DataFrame`, `int larger than 128 bits`).
    Unsupported(String),
    /// Python raised while it was read.
    Python(PyErr),
}

impl From<PyErr> for FromPyError {
    fn from(e: PyErr) -> Self {
        FromPyError::Python(e)
    }
}

/// Builds the Python object for a value (refused past `MAX_DEPTH` levels of nesting).
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    to_py_at(py, value, 0)
}

fn to_py_at<'py>(py: Python<'py>, value: &Value, depth: usize) -> PyResult<Bound<'py, PyAny>> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(format!(
            "the value is nested deeper than {MAX_DEPTH} levels, which the runtime does not convert"
        )));
    }
    let to_py = |py, v| to_py_at(py, v, depth + 1);
    Ok(match value {
        Value::None => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        // The 64-bit conversion is much faster than the 128-bit one.
        Value::Int(i) => match i64::try_from(*i) {
            Ok(small) => small.into_pyobject(py)?.into_any(),
            Err(_) => i.into_pyobject(py)?.into_any(),
        },
        Value::Float(x) => PyFloat::new(py, *x).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::List(items) => PyList::new(
            py,
            items
                .iter()
                .map(|v| to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any(),
        Value::Tuple(items) => PyTuple::new(
            py,
            items
                .iter()
                .map(|v| to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any(),
        Value::Set(items) => PySet::new(
            py,
            items
                .iter()
                .map(|v| to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any(),
        Value::Dict(entries) => {
            let dict = PyDict::new(py);
            for (k, v) in entries {
                dict.set_item(to_py(py, k)?, to_py(py, v)?)?;
            }
            dict.into_any()
        }
        _ => {
            return Err(PyTypeError::new_err(
                "this value kind has no Python counterpart yet",
            ));
        }
    })
}

/// Reads a Python object as a value. Records (dataclasses) become dicts and enum members their
/// names, through the executor's `to_plain`.
pub(crate) fn from_py(
    obj: &Bound<'_, PyAny>,
    executor: &Bound<'_, PyModule>,
) -> Result<Value, FromPyError> {
    from_py_at(obj, executor, 0)
}

fn from_py_at(
    obj: &Bound<'_, PyAny>,
    executor: &Bound<'_, PyModule>,
    depth: usize,
) -> Result<Value, FromPyError> {
    if depth > MAX_DEPTH {
        return Err(FromPyError::Unsupported(format!(
            "structure nested deeper than {MAX_DEPTH} levels"
        )));
    }
    let items = |seq: Vec<Bound<'_, PyAny>>| -> Result<Vec<Value>, FromPyError> {
        seq.iter()
            .map(|item| from_py_at(item, executor, depth + 1))
            .collect()
    };
    if obj.is_none() {
        return Ok(Value::None);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(small) = obj.extract::<i64>() {
            return Ok(Value::Int(small.into()));
        }
        return obj
            .extract::<i128>()
            .map(Value::Int)
            .map_err(|_| FromPyError::Unsupported("int larger than 128 bits".to_owned()));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(text_of(s)?));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Bytes(b.to_vec()));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(Value::List(items(list.iter().collect())?));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(Value::Tuple(items(tuple.iter().collect())?));
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            entries.push((
                from_py_at(&k, executor, depth + 1)?,
                from_py_at(&v, executor, depth + 1)?,
            ));
        }
        return Ok(Value::Dict(entries));
    }
    if let Ok(set) = obj.cast::<PySet>() {
        return Ok(Value::Set(items(set.iter().collect())?));
    }
    if let Ok(set) = obj.cast::<PyFrozenSet>() {
        return Ok(Value::Set(items(set.iter().collect())?));
    }
    // numpy and other integer-likes.
    if obj.hasattr("__index__")?
        && let Ok(i) = obj.extract::<i128>()
    {
        return Ok(Value::Int(i));
    }
    let plain = executor.call_method1("to_plain", (obj,))?;
    if !plain.is(obj) {
        return from_py_at(&plain, executor, depth + 1);
    }
    Err(FromPyError::Unsupported(
        obj.get_type().qualname()?.to_string(),
    ))
}

/// A Python `str` as UTF-8: each lone surrogate (which UTF-8 cannot hold) becomes one U+FFFD.
pub(crate) fn text_of(s: &Bound<'_, PyString>) -> PyResult<String> {
    match s.to_str() {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => s
            .call_method1("encode", ("utf-16", "surrogatepass"))?
            .call_method1("decode", ("utf-16", "replace"))?
            .extract(),
    }
}
