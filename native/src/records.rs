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
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyType};

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
struct RecordBuilder {
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
    fn build(slf: &Bound<Self>, records: &Bound<PyList>, codec: &Bound<PyAny>) -> Built {
        Built {
            builder: slf.clone().unbind(),
            records: records.clone().unbind(),
            codec: codec.clone().unbind(),
            read: 0,
            stopped: false,
        }
    }
}

impl RecordBuilder {
    /// The message over `record`, which is not an error.
    fn message<'py>(
        &self,
        record: &Bound<'py, PyAny>,
        codec: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = record.py();
        let value = record.call_method0(intern!(py, "value"))?;
        let message = allocate(self.cls.bind(py))?;
        // SAFETY: the offsets were located on the class and `message` is a fresh instance.
        unsafe {
            for &at in &self.record_at {
                put(&message, at, record);
            }
            put(&message, self.value_at, &value);
            put(&message, self.codec_at, codec);
            for (at, fixed) in &self.fixed {
                put(&message, *at, fixed.bind(py));
            }
        }
        Ok(message)
    }
}

/// The messages of a batch, made one at a time; `read` counts them, which is also the
/// index of the record with an error that ended them early, if one did.
#[pyclass(module = "amps_on_kafka_native")]
struct Built {
    builder: Py<RecordBuilder>,
    records: Py<PyList>,
    codec: Py<PyAny>,
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
        if !record.call_method0(intern!(py, "error"))?.is_none() {
            self.stopped = true;
            return Ok(None);
        }
        let message = self.builder.get().message(&record, self.codec.bind(py))?;
        self.read += 1;
        Ok(Some(message))
    }
}

/// `LogMessage.data`: the payload decoded on first access, then kept. A property's getter
/// is a Python frame (about 0.1 us a message); this descriptor decodes JSON with the
/// codec's own function (orjson's `loads`) and keeps the result in the message's slot
/// without one. Anything else (another codec, no payload, a payload that does not
/// decode, a slot not set) goes to the Python getter it stands for, which decides.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct LazyData {
    cls: Py<PyType>,
    data_at: isize,
    raw_at: isize,
    codec_at: isize,
    unset: Py<PyAny>,
    json: Py<PyAny>,
    loads: Py<PyAny>,
    #[pyo3(get)]
    getter: Py<PyAny>,
}

#[pymethods]
impl LazyData {
    /// `cls` (LogMessage), its slots that hold the decoded payload, the payload and the
    /// codec, the marker of a payload not decoded yet, the JSON codec, the function
    /// that decodes it, and the Python getter that does all of it.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cls: &Bound<PyType>,
        data_slot: &str,
        raw_slot: &str,
        codec_slot: &str,
        unset: Py<PyAny>,
        json: Py<PyAny>,
        loads: Py<PyAny>,
        getter: Py<PyAny>,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        Ok(Self {
            cls: cls.clone().unbind(),
            data_at: locate(cls, data_slot)?,
            raw_at: locate(cls, raw_slot)?,
            codec_at: locate(cls, codec_slot)?,
            unset,
            json,
            loads,
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
        if !message.is_instance(this.cls.bind(py))? {
            return this.getter.bind(py).call1((message,));
        }
        // SAFETY: `message` is an instance of the class whose slots were located.
        let (data, raw, codec) = unsafe {
            (
                read(message, this.data_at),
                read(message, this.raw_at),
                read(message, this.codec_at),
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
        match this.loads.bind(py).call1((raw,)) {
            Ok(decoded) => {
                // SAFETY: the slot holds `unset` (checked above), released here.
                unsafe { replace(message, this.data_at, &decoded) };
                Ok(decoded)
            }
            Err(_) => this.getter.bind(py).call1((message,)),
        }
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
unsafe fn replace(object: &Bound<PyAny>, at: isize, value: &Bound<PyAny>) {
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
