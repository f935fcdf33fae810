// hscapture._ring: thin nanobind bindings over csrc/ring.cpp. API: docs/ARCHITECTURE.md §1.
//
// Errors: the core throws hsc::RingException(kind, message); the translator below raises the
// class of the same name from the Python module `hscapture.errors` (defined once, there).
//
// Payload views: memoryviews over a tiny `_Buffer` object that owns a shared_ptr to the
// mapping, so the segment stays mapped while any view (or numpy/torch array made from one)
// is alive, even after Producer/Consumer.close().
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <Python.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "hscapture/cuda_copy.h"
#include "hscapture/layout.h"
#include "hscapture/ring.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// --- _Buffer: buffer-protocol owner of a slice of a mapping ---------------------------------------
struct BufferObject {
    PyObject_HEAD
    std::shared_ptr<hsc::Mapping>* keep;
    void* ptr;
    Py_ssize_t len;
    int readonly;
};

PyTypeObject* g_buffer_type = nullptr;

int buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
    auto* b = reinterpret_cast<BufferObject*>(self);
    return PyBuffer_FillInfo(view, self, b->ptr, b->len, b->readonly, flags);
}

void buffer_dealloc(PyObject* self) {
    auto* b = reinterpret_cast<BufferObject*>(self);
    delete b->keep;  // may unmap the segment (last reference)
    PyTypeObject* tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

PyType_Slot buffer_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(buffer_getbuffer)},
    {Py_tp_dealloc, reinterpret_cast<void*>(buffer_dealloc)},
    {Py_tp_doc, const_cast<char*>("Owner of a zero-copy ring payload (keeps the mapping alive).")},
    {0, nullptr},
};

PyType_Spec buffer_spec = {"hscapture._ring._Buffer", sizeof(BufferObject), 0, Py_TPFLAGS_DEFAULT, buffer_slots};

// Safety: `ptr[0:len]` must lie inside `*mapping`; the returned view keeps the mapping alive.
nb::object make_view(const std::shared_ptr<hsc::Mapping>& mapping, void* ptr, uint64_t len, bool readonly) {
    BufferObject* b = PyObject_New(BufferObject, g_buffer_type);
    if (!b) throw nb::python_error();
    b->keep = new std::shared_ptr<hsc::Mapping>(mapping);
    b->ptr = ptr;
    b->len = Py_ssize_t(len);
    b->readonly = readonly ? 1 : 0;
    PyObject* mv = PyMemoryView_FromObject(reinterpret_cast<PyObject*>(b));
    Py_DECREF(b);
    if (!mv) throw nb::python_error();
    return nb::steal(mv);
}

[[noreturn]] void raise(hsc::ErrorKind kind, const std::string& msg) { throw hsc::RingException(kind, msg); }

// --- Record ------------------------------------------------------------------------------------
struct Record {
    hsc::RecordView v;
    std::shared_ptr<hsc::Mapping> mapping;
};

nb::dict stats_dict(hsc::Producer& p) {
    hsc::ProducerStats s = p.stats();
    nb::dict d;
    d["committed"] = s.committed;
    d["reserved"] = s.reserved;
    d["aborted"] = s.aborted;
    d["full_count"] = s.full_count;
    d["control_full"] = s.control_full;
    d["reaped"] = s.reaped;
    d["expired"] = s.expired;
    d["min_released"] = s.min_released;
    d["live_consumers"] = s.live_consumers;
    d["detached_durable"] = s.detached_durable;
    d["expired_slots"] = s.expired_slots;
    d["head"] = s.head;
    d["next_seq"] = s.next_seq;
    return d;
}

const char* slot_state_name(uint32_t state) {
    switch (state) {
        case hsc::layout::SLOT_FREE: return "free";
        case hsc::layout::SLOT_ACTIVE: return "active";
        case hsc::layout::SLOT_EXPIRED: return "expired";
    }
    return "unknown";
}

nb::dict info_dict(const hsc::SegmentInfo& i) {
    nb::dict d;
    d["name"] = i.name;
    d["magic"] = i.magic;
    d["layout_version"] = i.layout_version;
    d["epoch"] = i.epoch;
    d["capacity"] = i.capacity;
    d["control_reserve"] = i.control_reserve;
    d["head"] = i.head;
    d["map_size"] = i.map_size;
    d["data_offset"] = i.data_offset;
    d["max_consumers"] = i.max_consumers;
    d["producer_pid"] = i.producer_pid;
    d["producer_alive"] = i.producer_alive;
    d["created_ns"] = i.created_ns;
    d["committed"] = i.committed;
    d["reserved"] = i.reserved;
    d["aborted"] = i.aborted;
    d["full_count"] = i.full_count;
    d["control_full"] = i.control_full;
    d["reaped"] = i.reaped;
    d["expired"] = i.expired;
    d["next_seq"] = i.next_seq;
    d["taken"] = i.taken;
    nb::list consumers;
    for (const auto& s : i.consumers) {
        nb::dict c;
        c["slot"] = s.slot;
        c["state"] = slot_state_name(s.state);
        c["active"] = s.state == hsc::layout::SLOT_ACTIVE;
        c["durable"] = s.durable;
        c["name"] = s.name;
        c["generation"] = s.generation;
        c["released"] = s.released;
        c["attached_at"] = s.attached_at;
        c["pid"] = s.pid;
        c["alive"] = s.alive;
        consumers.append(c);
    }
    d["consumers"] = consumers;
    return d;
}


// --- native CUDA copy path (csrc/cuda_copy.cpp) ------------------------------------------------
// Copy lists arrive as flat buffers of uint64 (array('Q')), 6 values per copy, in Copy2D order:
// no per-element Python conversion on the engine's hot path.
struct U64Buffer {
    Py_buffer view{};
    bool held = false;
    explicit U64Buffer(nb::handle obj) {
        if (obj.is_none()) return;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
        held = true;
        if (view.len % sizeof(hsc::cuda::Copy2D) != 0) {
            PyBuffer_Release(&view);
            held = false;
            throw nb::value_error("copy list: expected a multiple of 6 uint64 values");
        }
    }
    ~U64Buffer() { if (held) PyBuffer_Release(&view); }
    const hsc::cuda::Copy2D* data() const { return held ? static_cast<const hsc::cuda::Copy2D*>(view.buf) : nullptr; }
    size_t count() const { return held ? size_t(view.len) / sizeof(hsc::cuda::Copy2D) : 0; }
};

// write_ids: the token ids of an entry's rows, taken from host int64 (or int32) buffers, written
// as little-endian int32 into `dst[offset:]`, row after row. For an engine whose request token
// ids are host arrays (SGLang's array('q') fill ids): no device op on the engine's thread.
// Every source range and the destination are bounds-checked; an id outside [0, 2**31) is an
// error (the entry format stores int32), raised before anything is written.
struct ReadBuffer {
    Py_buffer view{};
    bool held = false;
    explicit ReadBuffer(PyObject* obj, int flags) {
        if (PyObject_GetBuffer(obj, &view, flags) != 0) throw nb::python_error();
        held = true;
    }
    ~ReadBuffer() { if (held) PyBuffer_Release(&view); }
    ReadBuffer(const ReadBuffer&) = delete;
    ReadBuffer& operator=(const ReadBuffer&) = delete;
};

uint64_t write_ids(nb::handle dst, uint64_t offset, nb::handle sources) {
    ReadBuffer out(dst.ptr(), PyBUF_WRITABLE);
    PyObject* src_list = sources.ptr();
    if (!PyList_Check(src_list)) throw nb::type_error("write_ids: sources must be a list");
    const Py_ssize_t n = PyList_GET_SIZE(src_list);
    struct Part { ReadBuffer* buf; uint64_t start, count; int width; };
    std::vector<std::unique_ptr<ReadBuffer>> held;
    std::vector<Part> parts;
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PyList_GET_ITEM(src_list, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3)
            throw nb::type_error("write_ids: each source must be (buffer, start, count)");
        held.push_back(std::make_unique<ReadBuffer>(PyTuple_GET_ITEM(item, 0), PyBUF_FORMAT | PyBUF_C_CONTIGUOUS));
        const Py_buffer& v = held.back()->view;
        const char* f = v.format ? v.format : "B";
        if (*f == '<' || *f == '=' || *f == '@') ++f;
        int width = 0;
        if (v.itemsize == 8 && (*f == 'q' || *f == 'l') && f[1] == 0) width = 8;
        if (v.itemsize == 4 && (*f == 'i' || (*f == 'l' && sizeof(long) == 4)) && f[1] == 0) width = 4;
        if (!width)
            throw nb::type_error(("write_ids: source " + std::to_string(i) +
                                  ": expected int64 or int32 items, found format '" +
                                  std::string(v.format ? v.format : "B") + "' of " +
                                  std::to_string(v.itemsize) + " bytes").c_str());
        long long start = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
        long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred()) throw nb::python_error();
        const uint64_t items = uint64_t(v.len) / uint64_t(width);
        if (start < 0 || count < 0 || uint64_t(start) + uint64_t(count) > items)
            throw nb::value_error(("write_ids: source " + std::to_string(i) + ": rows [" + std::to_string(start) + ", " +
                                   std::to_string(start + count) + ") outside its " + std::to_string(items) + " ids").c_str());
        parts.push_back({held.back().get(), uint64_t(start), uint64_t(count), width});
        total += uint64_t(count);
    }
    if (offset > uint64_t(out.view.len) || total * 4 > uint64_t(out.view.len) - offset)
        throw nb::value_error(("write_ids: " + std::to_string(total) + " ids at offset " + std::to_string(offset) +
                               " do not fit a destination of " + std::to_string(out.view.len) + " bytes").c_str());
    auto id_at = [](const Part& p, uint64_t k) -> int64_t {   // source id k of a part
        const char* base = static_cast<const char*>(p.buf->view.buf);
        if (p.width == 8) { int64_t v; std::memcpy(&v, base + 8 * (p.start + k), 8); return v; }
        int32_t v; std::memcpy(&v, base + 4 * (p.start + k), 4); return v;
    };
    for (size_t i = 0; i < parts.size(); ++i) {   // every id checked before a byte is written
        for (uint64_t k = 0; k < parts[i].count; ++k) {
            const int64_t id = id_at(parts[i], k);
            if (id < 0 || id > INT32_MAX)
                throw nb::value_error(("write_ids: source " + std::to_string(i) + " id " +
                                       std::to_string(parts[i].start + k) + " is " +
                                       std::to_string(id) + ", outside [0, 2**31)").c_str());
        }
    }
    uint8_t* at = static_cast<uint8_t*>(out.view.buf) + offset;
    for (const Part& p : parts) {
        for (uint64_t k = 0; k < p.count; ++k, at += 4) {
            const uint32_t u = static_cast<uint32_t>(id_at(p, k));   // little-endian int32
            at[0] = uint8_t(u); at[1] = uint8_t(u >> 8); at[2] = uint8_t(u >> 16); at[3] = uint8_t(u >> 24);
        }
    }
    return total;
}

// A CUDA event of the native path; destroyed with the object (errors at teardown ignored).
struct CudaEvent {
    uint64_t event = 0, context = 0;
    explicit CudaEvent(uint64_t context_ptr) {
        std::string err;
        if (hsc::cuda::event_create(context_ptr, &event, &context, &err) != 0)
            throw std::runtime_error("hscapture: " + err);
    }
    ~CudaEvent() { if (event) hsc::cuda::event_destroy(event, context); }
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
};

}  // namespace

NB_MODULE(_ring, m) {
    m.doc() = "hscapture shared-memory ring (native). API: docs/ARCHITECTURE.md section 1.";

    g_buffer_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&buffer_spec));
    if (!g_buffer_type) throw nb::python_error();
    m.attr("_Buffer") = nb::borrow(reinterpret_cast<PyObject*>(g_buffer_type));

    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const hsc::RingException& e) {
            if (e.kind() == hsc::ErrorKind::Value) {
                PyErr_SetString(PyExc_ValueError, e.what());
                return;
            }
            PyObject* mod = PyImport_ImportModule("hscapture.errors");
            PyObject* cls = mod ? PyObject_GetAttrString(mod, hsc::error_class_name(e.kind())) : nullptr;
            Py_XDECREF(mod);
            if (!cls) {  // hscapture.errors missing: still raise, never crash
                PyErr_Clear();
                PyErr_Format(PyExc_RuntimeError, "%s: %s", hsc::error_class_name(e.kind()), e.what());
                return;
            }
            PyErr_SetString(cls, e.what());
            Py_DECREF(cls);
        }
    });

    namespace L = hsc::layout;
    m.attr("MAGIC") = L::MAGIC;
    m.attr("LAYOUT_VERSION") = L::LAYOUT_VERSION;
    m.attr("RECORD_MAGIC") = L::RECORD_MAGIC;
    m.attr("RECORD_HEADER_SIZE") = L::RECORD_HEADER_SIZE;
    m.attr("RECORD_ALIGN") = L::RECORD_ALIGN;
    m.attr("CACHE_LINE") = L::CACHE_LINE;
    m.attr("PAGE_SIZE") = L::PAGE_SIZE;
    m.attr("HEADER_SIZE") = L::HEADER_SIZE;
    m.attr("SLOTS_OFFSET") = L::SLOTS_OFFSET;
    m.attr("SLOT_SIZE") = L::SLOT_SIZE;
    m.attr("SLOT_NAME_LEN") = L::SLOT_NAME_LEN;
    m.attr("MAX_CONSUMERS") = L::MAX_CONSUMERS;
    m.attr("STATE_RESERVED") = L::STATE_RESERVED;
    m.attr("STATE_COMMITTED") = L::STATE_COMMITTED;
    m.attr("STATE_ABORTED") = L::STATE_ABORTED;
    m.attr("STATE_PADDING") = L::STATE_PADDING;
    m.attr("SLOT_FREE") = L::SLOT_FREE;
    m.attr("SLOT_ACTIVE") = L::SLOT_ACTIVE;
    m.attr("SLOT_EXPIRED") = L::SLOT_EXPIRED;
    m.attr("SLOT_DURABLE_FLAG") = L::SLOT_DURABLE_FLAG;
    m.attr("PRODUCER_LOCK_OFFSET") = L::PRODUCER_LOCK_OFFSET;
    m.attr("SLOT_LOCK_OFFSET") = L::SLOT_LOCK_OFFSET;
    m.attr("REGISTRY_LOCK_OFFSET") = L::REGISTRY_LOCK_OFFSET;
    nb::dict so;
    so["state"] = L::S_STATE;
    so["released"] = L::S_RELEASED;
    so["pid"] = L::S_PID;
    so["name"] = L::S_NAME;
    so["attached_at"] = L::S_ATTACHED_AT;
    so["delivered"] = L::S_DELIVERED;
    so["unsettled"] = L::S_UNSETTLED;
    so["read_through"] = L::S_READ_THROUGH;
    m.attr("SLOT_OFFSETS") = so;
    nb::dict rh;
    rh["state"] = L::R_STATE;
    rh["magic"] = L::R_MAGIC;
    rh["epoch"] = L::R_EPOCH;
    rh["seq"] = L::R_SEQ;
    rh["payload_len"] = L::R_PAYLOAD_LEN;
    rh["total_len"] = L::R_TOTAL_LEN;
    rh["position"] = L::R_POSITION;
    rh["tag"] = L::R_TAG;
    rh["reserved"] = L::R_RESERVED;
    m.attr("RECORD_HEADER_OFFSETS") = rh;
    nb::dict sh;
    sh["magic"] = L::H_MAGIC;
    sh["layout_version"] = L::H_LAYOUT_VERSION;
    sh["max_consumers"] = L::H_MAX_CONSUMERS;
    sh["epoch"] = L::H_EPOCH;
    sh["capacity"] = L::H_CAPACITY;
    sh["data_offset"] = L::H_DATA_OFFSET;
    sh["map_size"] = L::H_MAP_SIZE;
    sh["producer_pid"] = L::H_PRODUCER_PID;
    sh["created_ns"] = L::H_CREATED_NS;
    sh["control_reserve"] = L::H_CONTROL_RESERVE;
    sh["head"] = L::H_HEAD;
    sh["committed"] = L::H_COMMITTED;
    sh["control_full"] = L::H_CONTROL_FULL;
    sh["expired"] = L::H_EXPIRED;
    sh["taken"] = L::H_TAKEN;
    m.attr("SEGMENT_HEADER_OFFSETS") = sh;

    m.def("record_total_len", [](uint64_t n) { return L::record_total_len(n); }, "payload_len"_a,
          "align64(RECORD_HEADER_SIZE + payload_len): bytes a record of this payload occupies.");
    m.def("data_offset", [](uint32_t n) { return L::data_offset(n); }, "max_consumers"_a);
    m.def("map_size", [](uint32_t n, uint64_t c) { return L::map_size(n, c); }, "max_consumers"_a, "capacity"_a);

    // --- Producer ---------------------------------------------------------------------------
    nb::class_<hsc::Producer>(m, "Producer",
                              "Single writer of a ring segment. Creates the segment (O_EXCL, mode 0600).")
        .def(nb::init<const std::string&, uint64_t, uint32_t, uint64_t, uint64_t>(), "name"_a, "capacity"_a,
             "max_consumers"_a = 8, "epoch"_a = 0, "control_reserve"_a = 0,
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("name", &hsc::Producer::name)
        .def_prop_ro("epoch", &hsc::Producer::epoch)
        .def_prop_ro("capacity", &hsc::Producer::capacity)
        .def_prop_ro("control_reserve", &hsc::Producer::control_reserve)
        .def_prop_ro("head", &hsc::Producer::head)
        .def_prop_rw("durable_expiry_ns", &hsc::Producer::durable_expiry_ns, &hsc::Producer::set_durable_expiry_ns,
                     "0 = a detached/dead durable subscription bounds the producer forever; > 0 = it is "
                     "EXPIRED once it has blocked reservations that long.")
        .def_prop_rw("dead_consumer_grace_ns", &hsc::Producer::dead_consumer_grace_ns,
                     &hsc::Producer::set_dead_consumer_grace_ns,
                     "DEPRECATED, no effect (replaced by durable subscriptions and durable_expiry_ns).")
        .def_prop_ro("closed", &hsc::Producer::closed)
        .def_prop_ro("map_address",
                     [](hsc::Producer& p) {
                         if (p.closed()) raise(hsc::ErrorKind::Ring, "Producer.map_address: closed");
                         return reinterpret_cast<uintptr_t>(p.mapping()->base);
                     })
        .def_prop_ro("map_size",
                     [](hsc::Producer& p) {
                         if (p.closed()) raise(hsc::ErrorKind::Ring, "Producer.map_size: closed");
                         return uint64_t(p.mapping()->size);
                     })
        .def_prop_ro("data_address",
                     [](hsc::Producer& p) {
                         if (p.closed()) raise(hsc::ErrorKind::Ring, "Producer.data_address: closed");
                         return reinterpret_cast<uintptr_t>(p.data());
                     })
        .def(
            "reserve",
            [](hsc::Producer& p, int64_t payload_len, uint64_t tag, bool control) -> int64_t {
                if (payload_len < 0) raise(hsc::ErrorKind::Value, "payload_len must be >= 0");
                int64_t r = p.reserve(uint64_t(payload_len), tag, control);
                if (r == hsc::RESERVE_TOO_LARGE) {
                    std::string limit = control || p.control_reserve() == 0
                                            ? "the ring capacity " + std::to_string(p.capacity())
                                            : std::to_string(p.capacity() - p.control_reserve()) +
                                                  " (capacity " + std::to_string(p.capacity()) +
                                                  " minus control_reserve " + std::to_string(p.control_reserve()) +
                                                  " for a data record)";
                    raise(hsc::ErrorKind::RecordTooLarge,
                          "record of payload " + std::to_string(payload_len) + " bytes needs " +
                              std::to_string(hsc::layout::record_total_len(uint64_t(payload_len))) +
                              " bytes: expected at most " + limit);
                }
                return r;  // position, or -1 when full (never blocks)
            },
            "payload_len"_a, "tag"_a = 0, "control"_a = false,
            "Reserve a record; returns its position or -1 if the ring is full. A data record "
            "(control=False) must leave control_reserve bytes free; a control record may use them.")
        .def(
            "payload",
            [](hsc::Producer& p, uint64_t position) {
                uint64_t len = 0;
                uint8_t* ptr = p.payload(position, &len);
                return make_view(p.mapping(), ptr, len, false);
            },
            "position"_a, "Writable zero-copy memoryview of the record's payload.")
        .def(
            "payload_address",
            [](hsc::Producer& p, uint64_t position) {
                uint64_t len = 0;
                return reinterpret_cast<uintptr_t>(p.payload(position, &len));
            },
            "position"_a)
        .def(
            "write",
            [](hsc::Producer& p, uint64_t position, nb::handle data, uint64_t offset) {
                ReadBuffer src(data.ptr(), PyBUF_C_CONTIGUOUS);
                uint64_t len = 0;
                uint8_t* dst = p.payload(position, &len);
                const uint64_t n = uint64_t(src.view.len);
                if (offset > len || n > len - offset)
                    raise(hsc::ErrorKind::Value,
                          "Producer.write: " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                              ": expected at most the record's payload of " + std::to_string(len) + " bytes");
                std::memcpy(dst + offset, src.view.buf, n);
            },
            "position"_a, "data"_a, "offset"_a = 0,
            "Copy the bytes of ``data`` (any C-contiguous buffer) into the reserved record's payload "
            "at ``offset``: one call, no view (ValueError past the payload, nothing written).")
        .def(
            "put",
            [](hsc::Producer& p, nb::handle data, uint64_t tag, bool control) -> int64_t {
                ReadBuffer src(data.ptr(), PyBUF_C_CONTIGUOUS);
                const uint64_t n = uint64_t(src.view.len);
                int64_t pos;
                if (n >= (1u << 20)) {
                    // A large copy runs without the GIL (the producer's own lock guards it; no
                    // call of ours waits for the GIL while holding that lock).
                    const std::shared_ptr<hsc::Mapping> keep = p.mapping();
                    nb::gil_scoped_release unlocked;
                    pos = p.put(src.view.buf, n, tag, control);
                } else {
                    pos = p.put(src.view.buf, n, tag, control);
                }
                if (pos == hsc::RESERVE_TOO_LARGE)
                    raise(hsc::ErrorKind::RecordTooLarge,
                          "Producer.put: a record of payload " + std::to_string(n) + " bytes needs " +
                              std::to_string(hsc::layout::record_total_len(n)) + " bytes: expected at most " +
                              std::to_string(control ? p.capacity() : p.capacity() - p.control_reserve()));
                return pos;
            },
            "data"_a, "tag"_a = 0, "control"_a = false,
            "reserve() + a copy of ``data`` (any C-contiguous buffer) into the payload + commit(), "
            "in one call, the record published whole (consumers never see it reserved). Returns "
            "the record's position, or -1 if the ring is full (nothing written; never blocks). "
            "RecordTooLargeError as reserve().")
        .def("record_seq", &hsc::Producer::record_seq, "position"_a)
        .def("commit", &hsc::Producer::commit, "position"_a)
        .def("abort", &hsc::Producer::abort, "position"_a)
        .def("store_taken", &hsc::Producer::store_taken, "n"_a,
             "Publish in the segment header that every sample number below n is taken "
             "(monotonic: a smaller n is a no-op).")
        .def("reap", &hsc::Producer::reap, nb::call_guard<nb::gil_scoped_release>())
        .def("stats", &stats_dict)
        .def("close", &hsc::Producer::close, "unlink"_a = true)
        .def("__enter__", [](nb::object self) { return self; })
        .def("__exit__", [](hsc::Producer& p, nb::args) { p.close(true); })
        .def("__repr__", [](hsc::Producer& p) {
            return "<hscapture._ring.Producer name='" + p.name() + "' capacity=" + std::to_string(p.capacity()) +
                   " head=" + std::to_string(p.head()) + (p.closed() ? " closed" : "") + ">";
        });

    // --- Record -----------------------------------------------------------------------------
    nb::class_<Record>(m, "Record", "A committed record, as seen by a Consumer.")
        .def_prop_ro("position", [](const Record& r) { return r.v.position; })
        .def_prop_ro("end", [](const Record& r) { return r.v.end; })
        .def_prop_ro("seq", [](const Record& r) { return r.v.seq; })
        .def_prop_ro("epoch", [](const Record& r) { return r.v.epoch; })
        .def_prop_ro("tag", [](const Record& r) { return r.v.tag; })
        .def_prop_ro("payload_len", [](const Record& r) { return r.v.payload_len; })
        .def_prop_ro(
            "payload",
            [](const Record& r) { return make_view(r.mapping, r.v.payload, r.v.payload_len, true); },
            "Read-only zero-copy memoryview; valid until the consumer releases past `end`.")
        .def("__repr__", [](const Record& r) {
            return "<hscapture._ring.Record position=" + std::to_string(r.v.position) +
                   " seq=" + std::to_string(r.v.seq) + " payload_len=" + std::to_string(r.v.payload_len) + ">";
        });

    // --- Consumer ---------------------------------------------------------------------------
    nb::class_<hsc::Consumer>(m, "Consumer", "Reader of a ring segment; holds one consumer slot.")
        .def(nb::init<const std::string&, uint64_t, const std::string&, bool>(), "name"_a,
             "expected_epoch"_a = 0, "resume_name"_a = "", nb::kw_only(), "resume_only"_a = false,
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("resumed", &hsc::Consumer::resumed)
        .def_prop_ro("durable", &hsc::Consumer::durable)
        .def_prop_ro("resume_name", &hsc::Consumer::resume_name)
        .def_prop_ro("attached_at", &hsc::Consumer::attached_at)
        .def_prop_ro("delivered", &hsc::Consumer::delivered,
                     "Durable: 1 + the record sequence number through which every sample was "
                     "acknowledged in order (0: none), as the slot holds it; a resumer reads "
                     "the previous owner's value.")
        .def("store_delivered", &hsc::Consumer::store_delivered, "value"_a,
             "Durable: record that every sample through sequence number value - 1 was "
             "acknowledged (monotonic; anonymous consumers: a no-op).")
        .def_prop_ro("unsettled", &hsc::Consumer::unsettled,
                     "Durable: 1 + the lowest record sequence number at which a chunk that "
                     "continues a sample its start was not seen may no longer be skipped on "
                     "resume (0: no bound but delivered), as the slot holds it.")
        .def("store_unsettled", &hsc::Consumer::store_unsettled, "value"_a,
             "Durable: record the bound above (any value; anonymous consumers: a no-op).")
        .def_prop_ro("read_through", &hsc::Consumer::read_through,
                     "Durable: 1 + the highest sample number of an entry the owners of this "
                     "place read (0: none), as the slot holds it; a resumer reads the previous "
                     "owner's value: numbers at or above it no owner read.")
        .def("store_read_through", &hsc::Consumer::store_read_through, "value"_a,
             "Durable: record the bound above before releasing the records it covers "
             "(monotonic; anonymous consumers: a no-op).")
        .def_prop_ro("expired", &hsc::Consumer::expired)
        .def_prop_ro("lost_from", &hsc::Consumer::lost_from)
        .def_prop_ro("lost_to", &hsc::Consumer::lost_to)
        .def_prop_ro("data_address",
                     [](hsc::Consumer& c) {
                         if (c.closed()) raise(hsc::ErrorKind::Ring, "Consumer.data_address: closed");
                         return reinterpret_cast<uintptr_t>(c.data());
                     })
        .def_prop_ro("name", &hsc::Consumer::name)
        .def_prop_ro("epoch", &hsc::Consumer::epoch)
        .def_prop_ro("capacity", &hsc::Consumer::capacity)
        .def_prop_ro("slot", &hsc::Consumer::slot)
        .def_prop_ro("position", &hsc::Consumer::position)
        .def_prop_ro("released", &hsc::Consumer::released)
        .def_prop_ro("head", &hsc::Consumer::head)
        .def_prop_ro("taken", &hsc::Consumer::taken,
                     "The producer's sample numbering: every number below it was taken "
                     "(captured, dropped or aborted), whether it reached the ring or not.")
        .def_prop_ro("closed", &hsc::Consumer::closed)
        .def(
            "poll",
            [](hsc::Consumer& c) -> nb::object {
                Record r;
                if (c.poll(&r.v) == hsc::PollStatus::Empty) return nb::none();
                r.mapping = c.mapping();
                return nb::cast(std::move(r));
            },
            "Next committed record, or None if none is committed yet (never waits).")
        .def(
            "take_into",
            [](hsc::Consumer& c, nb::handle dst) -> nb::object {
                ReadBuffer out(dst.ptr(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
                hsc::RecordView v;
                const hsc::PollStatus st = c.take(static_cast<uint8_t*>(out.view.buf), uint64_t(out.view.len), &v);
                if (st == hsc::PollStatus::Empty) return nb::none();
                if (st == hsc::PollStatus::TooSmall)
                    raise(hsc::ErrorKind::Value,
                          "Consumer.take_into: the next record's payload is " + std::to_string(v.payload_len) +
                              " bytes: expected a destination of at least that, found " +
                              std::to_string(out.view.len) + " (the record was not taken)");
                return nb::make_tuple(v.payload_len, v.seq, v.tag);
            },
            "dst"_a,
            "poll() + a copy of the next record's payload into ``dst`` (a writable C-contiguous "
            "buffer) + release() through its end, in one call: ``(payload_len, seq, tag)``, or "
            "None if none is committed (never waits). A destination shorter than the payload "
            "raises ValueError and leaves the record the next one poll()/take_into() returns.")
        .def("release", &hsc::Consumer::release, "position"_a)
        .def("producer_alive", &hsc::Consumer::producer_alive)
        .def("close", &hsc::Consumer::close,
             "Anonymous: free the slot. Durable: detach (the slot keeps its name and released position).")
        .def("unsubscribe", &hsc::Consumer::unsubscribe, "Free the slot for good; the consumer is closed after.")
        .def("__enter__", [](nb::object self) { return self; })
        .def("__exit__", [](hsc::Consumer& c, nb::args) { c.close(); })
        .def("__repr__", [](hsc::Consumer& c) {
            return "<hscapture._ring.Consumer name='" + c.name() + "' slot=" + std::to_string(c.slot()) +
                   " position=" + std::to_string(c.position()) + (c.closed() ? " closed" : "") + ">";
        });


    m.def("write_ids", &write_ids, "dst"_a, "offset"_a, "sources"_a,
          "Write the ids of (int64/int32 buffer, start, count) sources as little-endian int32 "
          "into dst[offset:], in order; returns how many. Bounds and the int32 range are "
          "checked first (ValueError, nothing written).");
    m.def("cuda_available", [] {
        std::string why;
        hsc::cuda::available(&why);
        return why;
    }, "'' when the native CUDA copy path can run (libcuda.so.1 and its functions), else why not.");
    m.def("cuda_submit", [](uint64_t caller, uint64_t side, uint64_t ready, uint64_t done, uint64_t context,
                            nb::handle pre, nb::handle post, bool defer) {
        U64Buffer a(pre), b(post);
        std::string err;
        if (hsc::cuda::submit(caller, side, ready, done, context, a.data(), a.count(), b.data(), b.count(), &err,
                              defer) != 0)
            return err.empty() ? std::string("CUDA copy submission failed") : err;
        return std::string();
    }, "caller"_a, "side"_a, "ready"_a, "done"_a, "context"_a, "pre"_a.none(), "post"_a.none(),
       "defer"_a = false,
       "Issue one capture's copies (see csrc/hscapture/cuda_copy.h); '' on success, else the error. "
       "defer: queue the device-to-host part until cuda_flush().");
    m.def("cuda_flush", [](uint64_t after, uint64_t max_bytes) {
        std::string err;
        int n = hsc::cuda::flush_deferred(&err, after, max_bytes);
        if (n < 0) throw std::runtime_error("hscapture: " + err);
        return n;
    }, "after"_a = 0, "max_bytes"_a = 0,
       "Issue the deferred captures' device-to-host copies, in order; returns how many captures "
       "were issued whole. after: a CUevent handle (0: none) the copies also wait for (the "
       "engine's read-back done). max_bytes (0: no bound): stop once that many bytes were "
       "issued, between two rows of a copy if need be (a capture queued for half the max age "
       "is issued whole). "
       "A failure raises (the first one), and each failed capture's done event reports it.");
    m.def("cuda_split_copy", [](std::array<uint64_t, 6> c, uint64_t budget) {
        using C = hsc::cuda::Copy2D;
        const hsc::cuda::CopySplit s = hsc::cuda::split_copy(C{c[0], c[1], c[2], c[3], c[4], c[5]}, budget);
        auto t = [](const C& x) { return std::array<uint64_t, 6>{x.dst, x.dst_pitch, x.src, x.src_pitch, x.width, x.height}; };
        return std::make_pair(t(s.part), s.all ? std::optional<std::array<uint64_t, 6>>() : t(s.rest));
    }, "copy"_a, "budget"_a,
       "How a budgeted flush (cuda_flush's max_bytes) splits one copy (dst, dst_pitch, src, "
       "src_pitch, width, height): (the part it issues, the rest or None). Pure arithmetic: "
       "no driver call.");
    m.def("cuda_set_defer_max_age", [](double seconds) {
        if (!(seconds >= 0.0)) raise(hsc::ErrorKind::Value, "max age must be >= 0 seconds");
        hsc::cuda::set_defer_max_age_ns(uint64_t(seconds * 1e9));
    }, "seconds"_a, "How long a deferred capture may wait before a synchronize on its event issues it (default 0.2 s).");
    m.def("cuda_deferred", &hsc::cuda::deferred_count, "Captures whose device-to-host copies are queued now.");
    nb::class_<CudaEvent>(m, "CudaEvent", "A CUDA event (no timing) of the native copy path.")
        .def(nb::init<uint64_t>(), "context_ptr"_a)
        .def_prop_ro("handle", [](const CudaEvent& e) { return e.event; })
        .def_prop_ro("context", [](const CudaEvent& e) { return e.context; },
                     "The CUcontext the event was created in (that of its context_ptr's allocation).")
        .def("query", [](const CudaEvent& e) {
            int rc = hsc::cuda::event_query(e.event, e.context);
            if (rc < 0) throw std::runtime_error("hscapture: cuEventQuery failed: CUresult " + std::to_string(-rc));
            return rc == 1;
        }, "True once every operation recorded before it completed (never blocks).")
        .def("synchronize", [](const CudaEvent& e) {
            std::string err;
            int rc;
            {
                nb::gil_scoped_release unlocked;   // the wait never holds the interpreter
                rc = hsc::cuda::event_synchronize(e.event, e.context, &err);
            }
            if (rc != 0) throw std::runtime_error("hscapture: " + err);
        }, "Block this thread (GIL released) until the event completed.");
    m.def("is_stale", &hsc::is_stale, "name"_a, "True if no live producer holds the segment's producer lock.");
    m.def("unlink", &hsc::unlink_segment, "name"_a, "shm_unlink the segment.");
    m.def("segment_info", [](const std::string& name) { return info_dict(hsc::segment_info(name)); }, "name"_a,
          "Header, counters and consumer slots of a segment (checks owner, mode, magic, version).");
}
