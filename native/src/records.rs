//! A replay's messages (`amps_on_kafka/log/message.py`, `RecordMessage`), built for a
//! whole consumed batch in one call.
//!
//! The Python twin (`message._BuiltOneByOne`) calls the class once per record: a Python
//! `__init__` frame and eight slot writes, about 0.25 us a record with the error check;
//! here ~0.15 us, the record's two C calls and freeing the message included
//! (docs/performance.md). Each message is allocated as `object.__new__` would and its
//! slots are written directly. Where
//! `setattr` stores each slot is not guessed: it is found once, when the builder is made,
//! by storing a marker through `setattr` on a probe instance and finding the marker.
use std::ptr;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyType};

/// A new instance of `cls` whose slots are all unset, as `object.__new__(cls)` makes it.
pub(crate) fn allocate<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyType_GenericAlloc is the allocator of every class defined in Python (the
    // constructor checks `cls` is one); it zeroes the instance, so every slot is unset.
    unsafe {
        let object = ffi::PyType_GenericAlloc(cls.as_type_ptr(), 0);
        Bound::from_owned_ptr_or_err(cls.py(), object)
    }
}

/// TypeError unless `cls` is a class defined in Python with slots and no `__dict__`.
pub(crate) fn check_layout(cls: &Bound<PyType>) -> PyResult<()> {
    if !allocated_as_python_classes(cls)?
        || cls
            .getattr(intern!(cls.py(), "__dictoffset__"))?
            .extract::<isize>()?
            != 0
    {
        return Err(PyTypeError::new_err(format!(
            "{} must be a class defined in Python with __slots__ and no __dict__",
            cls.name()?
        )));
    }
    Ok(())
}

/// Whether instances of `cls` are allocated as those of a class defined in Python are
/// (what `allocate` does for it).
fn allocated_as_python_classes(cls: &Bound<PyType>) -> PyResult<bool> {
    // SAFETY: reads a slot of a live type object.
    let alloc = unsafe { ffi::PyType_GetSlot(cls.as_type_ptr(), ffi::Py_tp_alloc) };
    let generic = ffi::PyType_GenericAlloc as *mut std::ffi::c_void;
    Ok(cls
        .getattr(intern!(cls.py(), "__flags__"))?
        .extract::<u64>()?
        & HEAP_TYPE
        != 0
        && alloc == generic)
}

/// `Py_TPFLAGS_HEAPTYPE`: the type was made at run time (a class statement).
const HEAP_TYPE: u64 = 1 << 9;

/// Where in an instance of `cls` the slot `name` is stored, found by storing a fresh
/// object through `setattr` on a probe instance and finding that object's address.
pub(crate) fn locate(cls: &Bound<PyType>, name: &str) -> PyResult<isize> {
    let py = cls.py();
    let size: isize = cls.getattr(intern!(py, "__basicsize__"))?.extract()?;
    let probe = allocate(cls)?;
    let marker = PyList::empty(py);
    probe.setattr(name, &marker)?;
    let word = std::mem::size_of::<*mut ffi::PyObject>() as isize;
    let header = std::mem::size_of::<ffi::PyObject>() as isize;
    let base = probe.as_ptr() as *const u8;
    let found: Vec<isize> = (header..size)
        .step_by(word as usize)
        // SAFETY: every offset read is inside the instance (below its basic size), and
        // slots are pointer-aligned.
        .filter(|&at| unsafe { *(base.offset(at) as *const *mut ffi::PyObject) } == marker.as_ptr())
        .collect();
    match found[..] {
        [at] => Ok(at),
        _ => Err(PyValueError::new_err(format!(
            "{name:?} is not a slot of {} (found {} places)",
            cls.name()?,
            found.len()
        ))),
    }
}

/// Stores `value` (a new reference) in the unset slot at `at` of `object`.
///
/// SAFETY: `at` comes from `locate` for `object`'s class or a base whose slots it shares,
/// and the slot is unset (the object was just allocated), so nothing is overwritten.
pub(crate) unsafe fn put(object: &Bound<PyAny>, at: isize, value: &Bound<PyAny>) {
    let slot = (object.as_ptr() as *mut u8).offset(at) as *mut *mut ffi::PyObject;
    *slot = value.clone().into_ptr();
}

/// Builds the messages of a consumed batch: instances of one class whose slots hold the
/// record, its payload, the codec and fixed values.
#[pyclass(frozen, module = "amps_on_kafka_native")]
pub(crate) struct RecordBuilder {
    cls: Py<PyType>,
    record_at: Vec<isize>,
    value_at: isize,
    codec_at: isize,
    fixed: Vec<(isize, Py<PyAny>)>,
}

#[pymethods]
impl RecordBuilder {
    /// `cls` (a class defined in Python, with slots and no `__init__` side effects the
    /// messages need), the slots that hold the record itself, the one that holds its
    /// `value()`, the one that holds the codec, and (slot, value) pairs every message
    /// starts with.
    #[new]
    fn new(
        cls: &Bound<PyType>,
        record_slots: Vec<String>,
        value_slot: &str,
        codec_slot: &str,
        fixed: Vec<(String, Py<PyAny>)>,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        let record_at = record_slots
            .iter()
            .map(|name| locate(cls, name))
            .collect::<PyResult<_>>()?;
        let fixed: Vec<(isize, Py<PyAny>)> = fixed
            .into_iter()
            .map(|(name, value)| Ok((locate(cls, &name)?, value)))
            .collect::<PyResult<_>>()?;
        let builder = Self {
            cls: cls.clone().unbind(),
            record_at,
            value_at: locate(cls, value_slot)?,
            codec_at: locate(cls, codec_slot)?,
            fixed,
        };
        let mut written: Vec<isize> = builder.record_at.clone();
        written.extend([builder.value_at, builder.codec_at]);
        written.extend(builder.fixed.iter().map(|(at, _)| *at));
        written.sort_unstable();
        if written.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(PyValueError::new_err("a slot is named twice"));
        }
        Ok(builder)
    }

    /// The messages of `records`, in order, up to the first record with an error: an
    /// iterator, so each message is made when it is asked for and freed when its reader
    /// drops it (a list of a batch's messages and their decoded payloads, alive at once,
    /// made the collector traverse them again and again).
    fn build(slf: &Bound<Self>, records: &Bound<PyList>, codec: &Bound<PyAny>) -> PyResult<Built> {
        let direct = match records.iter().next() {
            Some(first) => Direct::of(&first)?,
            None => None,
        };
        Ok(Built {
            builder: slf.clone().unbind(),
            records: records.clone().unbind(),
            codec: codec.clone().unbind(),
            direct,
            read: 0,
            stopped: false,
        })
    }
}

impl RecordBuilder {
    /// The message over `record`, which is not an error, and its `value()`.
    pub(crate) fn message<'py>(
        &self,
        record: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
        codec: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = record.py();
        let message = allocate(self.cls.bind(py))?;
        // SAFETY: the offsets were located on the class and `message` is a fresh instance.
        unsafe {
            for &at in &self.record_at {
                put(&message, at, record);
            }
            put(&message, self.value_at, value);
            put(&message, self.codec_at, codec);
            for (at, fixed) in &self.fixed {
                put(&message, *at, fixed.bind(py));
            }
        }
        Ok(message)
    }
}

/// The C functions of a consumed record's `error()` and `value()` (confluent-kafka's
/// `Message`), called directly for records of exactly that type. Called as Python calls
/// a method (finding it on the type, a call through its descriptor), each took ~330
/// instructions around a getter of ~10, two a record (docs/performance.md).
struct Direct {
    cls: Py<PyType>,
    error: ffi::PyCFunction,
    value: ffi::PyCFunction,
}

impl Direct {
    /// The functions behind `record.error()` and `record.value()` when both are built-in
    /// methods that take no argument, bound to the record itself, and its type keeps no
    /// attributes per instance (no `__dict__` to hold another `value`); None otherwise,
    /// and every record's methods are then called as Python calls them.
    fn of(record: &Bound<PyAny>) -> PyResult<Option<Self>> {
        let py = record.py();
        let cls = record.get_type();
        if cls
            .getattr(intern!(py, "__dictoffset__"))?
            .extract::<isize>()?
            != 0
        {
            return Ok(None);
        }
        let error = no_args_function(record, intern!(py, "error"))?;
        let value = no_args_function(record, intern!(py, "value"))?;
        Ok(error.zip(value).map(|(error, value)| Self {
            cls: cls.unbind(),
            error,
            value,
        }))
    }
}

/// The C function of `record.<name>` if it is a built-in method that takes no argument
/// (`METH_NOARGS` alone) bound to `record`.
fn no_args_function(
    record: &Bound<PyAny>,
    name: &Bound<PyString>,
) -> PyResult<Option<ffi::PyCFunction>> {
    let Ok(method) = record.getattr(name) else {
        return Ok(None); // called as Python calls it, it fails there, as the twin's does
    };
    let method = method.as_ptr();
    // SAFETY: reads of a live object; the function is only taken from a built-in method.
    unsafe {
        if ffi::PyCFunction_Check(method) == 0
            || ffi::PyCFunction_GetSelf(method) != record.as_ptr()
            || ffi::PyCFunction_GetFlags(method) != ffi::METH_NOARGS
        {
            return Ok(None);
        }
        Ok(ffi::PyCFunction_GetFunction(method))
    }
}

/// `record.<method>()` through the method's C function, as CPython calls a `METH_NOARGS`
/// function: the object and no argument.
///
/// SAFETY: `function` is a `METH_NOARGS` method of `record`'s exact type (`Direct`).
unsafe fn call_no_args<'py>(
    record: &Bound<'py, PyAny>,
    function: ffi::PyCFunction,
) -> PyResult<Bound<'py, PyAny>> {
    Bound::from_owned_ptr_or_err(record.py(), function(record.as_ptr(), ptr::null_mut()))
}

/// The messages of a batch, made one at a time; `read` counts them, which is also the
/// index of the record with an error that ended them early, if one did.
#[pyclass(module = "amps_on_kafka_native")]
struct Built {
    builder: Py<RecordBuilder>,
    records: Py<PyList>,
    codec: Py<PyAny>,
    direct: Option<Direct>,
    #[pyo3(get)]
    read: usize,
    stopped: bool,
}

#[pymethods]
impl Built {
    fn __iter__(slf: PyRef<Self>) -> PyRef<Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let records = self.records.bind(py);
        if self.stopped || self.read >= records.len() {
            return Ok(None);
        }
        let record = records.get_item(self.read)?;
        let direct = self
            .direct
            .as_ref()
            .filter(|direct| record.get_type().is(direct.cls.bind(py)));
        // SAFETY: `direct` holds the functions of methods of `record`'s exact type.
        let error = match direct {
            Some(direct) => unsafe { call_no_args(&record, direct.error)? },
            None => record.call_method0(intern!(py, "error"))?,
        };
        if !error.is_none() {
            self.stopped = true;
            return Ok(None);
        }
        // SAFETY: as above.
        let value = match direct {
            Some(direct) => unsafe { call_no_args(&record, direct.value)? },
            None => record.call_method0(intern!(py, "value"))?,
        };
        let message = self
            .builder
            .get()
            .message(&record, &value, self.codec.bind(py))?;
        self.read += 1;
        Ok(Some(message))
    }
}

/// `LogMessage.data`: the payload decoded on first access, then kept. A property's getter
/// is a Python frame (about 0.1 us a message); this descriptor decodes JSON with the
/// codec's own function (orjson's `loads`) and keeps the result in the message's slot
/// without one. Anything else (another codec, no payload, a payload that does not
/// decode, a slot not set) goes to the Python getter it stands for, which decides. A
/// class whose payloads are all JSON (the tcp:// client's `GatewayMessage`) names no
/// codec slot.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct LazyData {
    cls: Py<PyType>,
    data_at: isize,
    raw_at: isize,
    codec_at: Option<isize>,
    unset: Py<PyAny>,
    json: Py<PyAny>,
    loads: Py<PyAny>,
    /// `loads`' C function and the object it is bound to when it is a built-in function
    /// of one argument (orjson's is): called directly, without the 1-tuple a call
    /// through the C API builds (~200 instructions a message).
    loads_direct: Option<(ffi::PyCFunction, Option<Py<PyAny>>)>,
    #[pyo3(get)]
    getter: Py<PyAny>,
}

#[pymethods]
impl LazyData {
    /// `cls` (LogMessage), its slots that hold the decoded payload, the payload and the
    /// codec (None: every payload is JSON), the marker of a payload not decoded yet,
    /// the JSON codec, the function that decodes it, and the Python getter that does
    /// all of it.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cls: &Bound<PyType>,
        data_slot: &str,
        raw_slot: &str,
        codec_slot: Option<&str>,
        unset: Py<PyAny>,
        json: Py<PyAny>,
        loads: Py<PyAny>,
        getter: Py<PyAny>,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        let loads_direct = one_arg_function(loads.bind(cls.py()));
        Ok(Self {
            cls: cls.clone().unbind(),
            data_at: locate(cls, data_slot)?,
            raw_at: locate(cls, raw_slot)?,
            codec_at: codec_slot.map(|slot| locate(cls, slot)).transpose()?,
            unset,
            json,
            loads,
            loads_direct,
            getter,
        })
    }

    fn __get__<'py>(
        slf: &Bound<'py, Self>,
        message: Option<&Bound<'py, PyAny>>,
        _owner: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let Some(message) = message else {
            return Ok(slf.clone().into_any()); // read on the class
        };
        // Its type, not what `__class__` says (isinstance's answer): the slots are read
        // where they are laid out in instances of that type.
        // SAFETY: both are live type objects.
        if unsafe {
            ffi::PyType_IsSubtype(ffi::Py_TYPE(message.as_ptr()), this.cls.as_ptr().cast())
        } == 0
        {
            return this.getter.bind(py).call1((message,));
        }
        // SAFETY: `message` is an instance of the class whose slots were located.
        let (data, raw, codec) = unsafe {
            (
                read(message, this.data_at),
                read(message, this.raw_at),
                this.codec_at
                    .map_or(this.json.as_ptr(), |at| read(message, at)),
            )
        };
        if !data.is_null() && data != this.unset.as_ptr() {
            // SAFETY: a live object the slot holds a reference to.
            return Ok(unsafe { Bound::from_borrowed_ptr(py, data) });
        }
        if data.is_null() || raw.is_null() || codec != this.json.as_ptr() {
            return this.getter.bind(py).call1((message,));
        }
        // SAFETY: the slot holds a reference to `raw`, alive while `message` is.
        let raw = unsafe { Bound::from_borrowed_ptr(py, raw) };
        if !raw.is_instance_of::<PyBytes>() {
            return this.getter.bind(py).call1((message,));
        }
        let decoded = match &this.loads_direct {
            // SAFETY: a METH_O function, called as CPython calls one: its bound object
            // (null for none) and the one argument.
            Some((loads, bound)) => unsafe {
                let bound = bound.as_ref().map_or(ptr::null_mut(), |b| b.as_ptr());
                Bound::from_owned_ptr_or_err(py, loads(bound, raw.as_ptr()))
            },
            None => this.loads.bind(py).call1((raw,)),
        };
        match decoded {
            Ok(decoded) => {
                // SAFETY: the slot holds `unset` (checked above), released here.
                unsafe { replace(message, this.data_at, &decoded) };
                Ok(decoded)
            }
            Err(_) => this.getter.bind(py).call1((message,)),
        }
    }
}

/// The C function of `function` and the object it is bound to, if it is a built-in
/// function of one argument (`METH_O` alone).
fn one_arg_function(function: &Bound<PyAny>) -> Option<(ffi::PyCFunction, Option<Py<PyAny>>)> {
    let py = function.py();
    let function = function.as_ptr();
    // SAFETY: reads of a live object; the function is only taken from a built-in one.
    unsafe {
        if ffi::PyCFunction_Check(function) == 0
            || ffi::PyCFunction_GetFlags(function) != ffi::METH_O
        {
            return None;
        }
        let bound = ffi::PyCFunction_GetSelf(function);
        let bound = (!bound.is_null()).then(|| Py::from_borrowed_ptr(py, bound));
        Some((ffi::PyCFunction_GetFunction(function)?, bound))
    }
}

/// The object the slot at `at` of `object` holds (null when unset), not a new reference.
///
/// SAFETY: `at` was located on `object`'s class or a base whose slots it shares.
pub(crate) unsafe fn read(object: &Bound<PyAny>, at: isize) -> *mut ffi::PyObject {
    *((object.as_ptr() as *const u8).offset(at) as *const *mut ffi::PyObject)
}

/// Stores `value` (a new reference) in the slot at `at`, releasing what it held.
///
/// SAFETY: as for `read`.
pub(crate) unsafe fn replace(object: &Bound<PyAny>, at: isize, value: &Bound<PyAny>) {
    let slot = (object.as_ptr() as *mut u8).offset(at) as *mut *mut ffi::PyObject;
    let old = *slot;
    *slot = value.clone().into_ptr();
    ffi::Py_XDECREF(old);
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<RecordBuilder>()?;
    m.add_class::<Built>()?;
    m.add_class::<LazyData>()
}
