// hscapture._meta: the producer's hot-path encoder of a `batch` entry's meta (protocol v2),
// and the subscriber's copies of whole rows out of a validated entry (copy_rows, below).
//
// Why native: the entry meta is planned once per forward pass on an engine's scheduler thread,
// where a few hundred Python operations cost ~75 us cold (H200 1B server, results
// h200-2026-12-01g) against ~11 us in a tight loop. This does the same work in one call.
//
// It is NOT a second definition of the format. hscapture/record.py (`plan_batch`) is the
// format's one implementation and stays the reference: tests/test_meta_native.py checks that
// this produces the same bytes and layout for any input (hypothesis), and the producer falls
// back to record.py whenever this says `Unsupported`. The encoder below writes what
// msgpack-python's `packb(obj, use_bin_type=True)` writes, for the EXACT types None, bool, int,
// float, str, bytes, bytearray, list, tuple and dict only (a subclass, any other type, a value
// out of msgpack's range or nesting deeper than kMaxDepth is Unsupported: the Python path then
// encodes it, or raises the error the format defines).
#include <nanobind/nanobind.h>

#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

constexpr int kMaxDepth = 64;
constexpr uint64_t kAlign = 64;   // record.ALIGN: every region of a payload starts 64-aligned

struct Unsupported {};            // -> the Python reference path

class Writer {
public:
    std::string out;

    void byte(uint8_t b) { out.push_back(static_cast<char>(b)); }
    void be(uint64_t v, int n) {
        for (int i = n - 1; i >= 0; --i) byte(static_cast<uint8_t>(v >> (8 * i)));
    }
    void uint(uint64_t v) {
        if (v < 0x80) byte(static_cast<uint8_t>(v));
        else if (v <= 0xff) { byte(0xcc); be(v, 1); }
        else if (v <= 0xffff) { byte(0xcd); be(v, 2); }
        else if (v <= 0xffffffffULL) { byte(0xce); be(v, 4); }
        else { byte(0xcf); be(v, 8); }
    }
    void sint(int64_t v) {   // msgpack-c's pack_long_long: the smallest signed form
        if (v >= 0) return uint(static_cast<uint64_t>(v));
        if (v >= -32) byte(static_cast<uint8_t>(v));
        else if (v >= -128) { byte(0xd0); be(static_cast<uint8_t>(v), 1); }
        else if (v >= -32768) { byte(0xd1); be(static_cast<uint16_t>(v), 2); }
        else if (v >= INT32_MIN) { byte(0xd2); be(static_cast<uint32_t>(v), 4); }
        else { byte(0xd3); be(static_cast<uint64_t>(v), 8); }
    }
    void header(uint64_t n, uint8_t fix, uint8_t fix_limit, uint8_t b8, uint8_t b16, uint8_t b32) {
        if (n < fix_limit) byte(static_cast<uint8_t>(fix | n));
        else if (b8 && n <= 0xff) { byte(b8); be(n, 1); }
        else if (n <= 0xffff) { byte(b16); be(n, 2); }
        else if (n <= 0xffffffffULL) { byte(b32); be(n, 4); }
        else throw Unsupported{};
    }
    void str(const char* s, size_t n) {
        header(n, 0xa0, 32, 0xd9, 0xda, 0xdb);
        out.append(s, n);
    }
    void str(const char* s) { str(s, std::strlen(s)); }
    void bin(const char* s, size_t n) {
        if (n <= 0xff) { byte(0xc4); be(n, 1); }
        else if (n <= 0xffff) { byte(0xc5); be(n, 2); }
        else if (n <= 0xffffffffULL) { byte(0xc6); be(n, 4); }
        else throw Unsupported{};
        out.append(s, n);
    }
    void array(uint64_t n) { header(n, 0x90, 16, 0, 0xdc, 0xdd); }
    void map(uint64_t n) { header(n, 0x80, 16, 0, 0xde, 0xdf); }

    void pack(PyObject* o, int depth) {
        if (depth > kMaxDepth) throw Unsupported{};
        if (o == Py_None) return byte(0xc0);
        if (o == Py_True) return byte(0xc3);
        if (o == Py_False) return byte(0xc2);
        if (PyLong_CheckExact(o)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
            if (overflow == 0) {
                if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); throw Unsupported{}; }
                return sint(v);
            }
            if (overflow < 0) throw Unsupported{};
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
                PyErr_Clear();       // > 2**64 - 1: msgpack raises; the Python path will
                throw Unsupported{};
            }
            return uint(u);
        }
        if (PyFloat_CheckExact(o)) {
            double d = PyFloat_AS_DOUBLE(o);
            uint64_t bits;
            std::memcpy(&bits, &d, sizeof bits);
            byte(0xcb);
            return be(bits, 8);
        }
        if (PyUnicode_CheckExact(o)) {
            Py_ssize_t n = 0;
            const char* s = PyUnicode_AsUTF8AndSize(o, &n);
            if (!s) { PyErr_Clear(); throw Unsupported{}; }   // e.g. a lone surrogate
            return str(s, static_cast<size_t>(n));
        }
        if (PyBytes_CheckExact(o))
            return bin(PyBytes_AS_STRING(o), static_cast<size_t>(PyBytes_GET_SIZE(o)));
        if (PyByteArray_CheckExact(o))
            return bin(PyByteArray_AS_STRING(o), static_cast<size_t>(PyByteArray_GET_SIZE(o)));
        if (PyDict_CheckExact(o)) {
            map(static_cast<uint64_t>(PyDict_GET_SIZE(o)));
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            while (PyDict_Next(o, &pos, &k, &v)) {   // insertion order, as msgpack-python
                pack(k, depth + 1);
                pack(v, depth + 1);
            }
            return;
        }
        if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
            PyObject* seq = o;
            Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
            array(static_cast<uint64_t>(n));
            PyObject** items = PySequence_Fast_ITEMS(seq);
            for (Py_ssize_t i = 0; i < n; ++i) pack(items[i], depth + 1);
            return;
        }
        throw Unsupported{};
    }
};

int uint_size(uint64_t v) {   // record._uint_size: bytes msgpack uses for the int v >= 0
    return v < 0x80 ? 1 : v < 0x100 ? 2 : v < 0x10000 ? 3 : v < (1ULL << 32) ? 5 : 9;
}

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t exact_int(PyObject* o) {
    if (!PyLong_CheckExact(o)) throw Unsupported{};
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); throw Unsupported{}; }
    return v;
}

std::vector<int64_t> int_list(nb::handle h) {
    PyObject* o = h.ptr();
    if (!PyList_CheckExact(o) && !PyTuple_CheckExact(o)) throw Unsupported{};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = exact_int(items[i]);
    return out;
}

nb::list py_list(const std::vector<uint64_t>& v) {
    nb::list out;
    for (uint64_t x : v) out.append(x);
    return out;
}

// record.plan_batch(..., check=False), its layout returned as a tuple (see the binding's doc).
nb::object plan_batch(uint64_t version, nb::handle producer, nb::handle epoch, nb::handle seq, nb::handle dp_rank,
                      nb::handle layers, nb::handle layer_kinds, nb::handle convention,
                      nb::handle model, nb::handle hidden, nb::handle dtype, int64_t itemsize,
                      nb::handle rows, nb::handle block_cols_h, nb::handle layer_map) {
    PyObject* rows_o = rows.ptr();
    if (!PyList_CheckExact(rows_o) && !PyTuple_CheckExact(rows_o)) throw Unsupported{};
    const Py_ssize_t n_rows = PySequence_Fast_GET_SIZE(rows_o);
    PyObject** row_items = PySequence_Fast_ITEMS(rows_o);
    std::vector<uint64_t> row_starts;
    row_starts.reserve(static_cast<size_t>(n_rows));
    uint64_t tokens = 0;
    for (Py_ssize_t r = 0; r < n_rows; ++r) {
        PyObject* row = row_items[r];
        if (!PyDict_CheckExact(row)) throw Unsupported{};
        PyObject* count = PyDict_GetItemString(row, "token_count");   // borrowed
        if (!count) throw Unsupported{};
        int64_t c = exact_int(count);
        if (c < 0) throw Unsupported{};
        row_starts.push_back(tokens);
        tokens += static_cast<uint64_t>(c);
    }
    const std::vector<int64_t> cols_signed = int_list(block_cols_h);
    std::vector<uint64_t> block_cols;
    for (int64_t c : cols_signed) {
        if (c < 0) throw Unsupported{};
        block_cols.push_back(static_cast<uint64_t>(c));
    }
    if (itemsize <= 0) throw Unsupported{};

    // The 15 placement-free entries, in canonical key order, behind a map16(18) header.
    Writer w;
    w.byte(0xde); w.be(18, 2);
    w.str("v"); w.uint(version);
    w.str("kind"); w.str("batch");
    w.str("producer"); w.pack(producer.ptr(), 1);
    w.str("epoch"); w.pack(epoch.ptr(), 1);
    w.str("seq"); w.pack(seq.ptr(), 1);
    w.str("dp_rank"); w.pack(dp_rank.ptr(), 1);
    w.str("layers"); w.pack(layers.ptr(), 1);
    w.str("layer_kinds"); w.pack(layer_kinds.ptr(), 1);
    w.str("convention"); w.pack(convention.ptr(), 1);
    w.str("model"); w.pack(model.ptr(), 1);
    w.str("hidden"); w.pack(hidden.ptr(), 1);
    w.str("dtype"); w.pack(dtype.ptr(), 1);
    w.str("tokens"); w.uint(tokens);
    w.str("layer_map"); w.pack(layer_map.ptr(), 1);
    w.str("rows"); w.pack(rows_o, 1);

    // The placement fields' size depends on their values, which depend on the meta's length:
    // the fixed point of record.plan_batch, computed the same way (sizes only, then encoded).
    const size_t nb_ = block_cols.size();
    uint64_t fixed = w.out.size() + (1 + 6) + (1 + 10) + (1 + 6) + (nb_ < 16 ? 1 : nb_ < 0x10000 ? 3 : 5);
    std::vector<uint64_t> row_bytes(nb_), rel(nb_);
    uint64_t at = 0;
    for (size_t b = 0; b < nb_; ++b) {
        fixed += 1 + static_cast<uint64_t>(uint_size(block_cols[b]));
        uint64_t cells = 0;
        if (__builtin_mul_overflow(tokens, block_cols[b], &cells) ||
            __builtin_mul_overflow(cells, static_cast<uint64_t>(itemsize), &row_bytes[b]) ||
            row_bytes[b] > (1ULL << 60) || at > (1ULL << 60))
            throw Unsupported{};   // beyond any ring: the Python path computes it exactly
        rel[b] = at;
        at = align_up(at + row_bytes[b]);
    }
    if (tokens > (1ULL << 56)) throw Unsupported{};
    const uint64_t rel_ids = at;
    uint64_t meta_len = fixed + 1 + 1 + nb_;   // every placement int at its 1-byte minimum
    uint64_t start = 0, ids_offset = 0, length = 0;
    bool converged = false;
    for (int round = 0; round < 8; ++round) {   // record._MAX_FIXED_POINT_ROUNDS
        start = align_up(4 + meta_len);
        ids_offset = start + rel_ids;
        length = ids_offset + 4 * tokens;
        uint64_t new_len = fixed + uint_size(ids_offset) + uint_size(length);
        for (size_t b = 0; b < nb_; ++b) new_len += uint_size(start + rel[b]);
        if (new_len == meta_len) { converged = true; break; }
        meta_len = new_len;
    }
    if (!converged) throw Unsupported{};
    std::vector<uint64_t> offsets(nb_);
    w.str("blocks");
    w.array(nb_);
    for (size_t b = 0; b < nb_; ++b) {
        offsets[b] = start + rel[b];
        w.array(2); w.uint(offsets[b]); w.uint(block_cols[b]);
    }
    w.str("ids_offset"); w.uint(ids_offset);
    w.str("length"); w.uint(length);
    if (w.out.size() != meta_len) throw Unsupported{};   // cannot happen: sizes are msgpack's

    nb::list pads;
    uint64_t end = 4 + meta_len;
    for (size_t b = 0; b < nb_; ++b) {
        if (offsets[b] > end) pads.append(nb::make_tuple(end, offsets[b]));
        end = offsets[b] + row_bytes[b];
    }
    if (ids_offset > end) pads.append(nb::make_tuple(end, ids_offset));
    nb::bytes meta(w.out.data(), w.out.size());
    return nb::make_tuple(meta, py_list(offsets), py_list(row_bytes), ids_offset, length, tokens,
                          py_list(row_starts), pads);
}

// --- the subscriber's copies of whole one-row samples, as DLPack capsules ------------------
//
// Why native: a one-token sample's owned tensors cost the subscriber a numpy copy, a
// torch.from_numpy and (bf16, which numpy lacks) a .view per tensor, ~2.3 us of the ~8 us a
// sample costs; torch.from_dlpack of a capsule that already says bfloat16 is one tensor
// creation. copy_rows copies the rows of one entry (one call per entry) into memory that each
// tensor then owns: the bytes are those of record.RowView (same rows, same columns, the
// layers C-contiguous as numpy's copy made them); what to copy is the caller's, from the
// entry record.read_entry validated (every range is checked again here all the same).
//
// Memory ordering: the payload is a committed record of the ring, handed to this thread by
// Consumer::poll after its acquire load of the record's state (csrc/ring.cpp), and it is not
// released before the entry's dispatch returns (Source.pump); these plain reads run on that
// thread inside the dispatch, so they see the producer's bytes, as numpy's copy did. The
// copies are private heap memory from here on: no atomics.

// The DLPack ABI (dlpack.h, "DLManagedTensor", unchanged since v0.2 and read by every
// consumer as the capsule named "dltensor"), only what a CPU tensor needs.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLInt = 0, kDLFloat = 2, kDLBfloat = 4;

// The sample dtypes (notice.DTYPES names) a capsule carries as themselves: fp8 is not here
// (DLPack's fp8 codes are newer than some consumers), the caller copies it with numpy.
struct RowDtype { const char* name; DLDataType dl; };
constexpr RowDtype kRowDtypes[] = {
    {"bfloat16", {kDLBfloat, 16, 1}}, {"float16", {kDLFloat, 16, 1}},
    {"float32", {kDLFloat, 32, 1}}};

// One allocation per tensor: this header, then the data at the next 64-byte boundary.
struct OwnedTensor {
    DLManagedTensor managed;
    int64_t shape[2];
    int64_t strides[2];
};

void free_owned(DLManagedTensor* managed) { std::free(managed->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
    // a consumer renames the capsule "used_dltensor" and frees the tensor itself; one never
    // consumed (its row went another way) is freed here. (No Python error may leak out of a
    // destructor: the current one is kept aside.)
    if (!PyCapsule_IsValid(capsule, "dltensor")) return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed) managed->deleter(managed);
    PyErr_Restore(type, value, traceback);
}

// A capsule of a fresh C-contiguous [rows, cols] (cols == 0: 1-D [rows]) tensor of `dtype`;
// `data` is set to where its bytes go (rows * row_bytes of them).
nb::object owned_capsule(DLDataType dtype, int64_t rows, int64_t cols, size_t nbytes,
                         uint8_t** data) {
    const size_t head = (sizeof(OwnedTensor) + 63) / 64 * 64;
    void* base = std::malloc(head + nbytes + 64);
    if (!base) throw std::bad_alloc();
    auto* owned = static_cast<OwnedTensor*>(base);
    uintptr_t at = reinterpret_cast<uintptr_t>(base) + head;
    at = (at + 63) / 64 * 64;
    *data = reinterpret_cast<uint8_t*>(at);
    owned->shape[0] = rows;
    owned->shape[1] = cols;
    owned->strides[0] = cols ? cols : 1;
    owned->strides[1] = 1;
    DLTensor& t = owned->managed.dl_tensor;
    t.data = *data;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = cols ? 2 : 1;
    t.dtype = dtype;
    t.shape = owned->shape;
    t.strides = owned->strides;
    t.byte_offset = 0;
    owned->managed.manager_ctx = base;
    owned->managed.deleter = free_owned;
    PyObject* capsule = PyCapsule_New(&owned->managed, "dltensor", capsule_destructor);
    if (!capsule) {
        std::free(base);
        throw nb::python_error();
    }
    return nb::steal(capsule);
}

uint64_t checked_end(uint64_t first, uint64_t pitch, uint64_t tokens, uint64_t width) {
    // first + (tokens - 1) * pitch + width, or UINT64_MAX when that overflows (tokens >= 1)
    uint64_t span = 0, end = 0;
    if (__builtin_mul_overflow(tokens - 1, pitch, &span) ||
        __builtin_add_overflow(first, span, &end) || __builtin_add_overflow(end, width, &end))
        return UINT64_MAX;
    return end;
}

// copy_rows: see the binding's doc. Every tensor is made (and every range checked) first,
// with the GIL; the bytes are then copied, without it once they add up to a megabyte (a
// long prompt's rows: other Python threads of the process run meanwhile, as they did during
// numpy's copies; the payload view is held, so the ring record stays mapped).
nb::list copy_rows(nb::handle payload, nb::handle rows_h, nb::handle layers_h, int64_t hidden,
                   int64_t ids_offset, const char* dtype_name) {
    DLDataType dtype{};
    bool known = false;
    for (const RowDtype& d : kRowDtypes)
        if (std::strcmp(d.name, dtype_name) == 0) { dtype = d.dl; known = true; }
    if (!known) throw Unsupported{};
    const uint64_t itemsize = dtype.bits / 8;
    if (hidden < 1 || ids_offset < 0) throw nb::value_error("copy_rows: bad hidden or ids_offset");
    const std::vector<int64_t> rows = int_list(rows_h);      // r0, count, r0, count, ...
    const std::vector<int64_t> layers = int_list(layers_h);  // first, pitch, first, pitch, ...
    if (rows.size() % 2 || layers.size() % 2 || layers.empty())
        throw nb::value_error("copy_rows: rows and layers are (start, count) / (first, pitch) pairs");
    Py_buffer view;
    if (PyObject_GetBuffer(payload.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    struct Release { Py_buffer* v; ~Release() { PyBuffer_Release(v); } } release{&view};
    const auto* src = static_cast<const uint8_t*>(view.buf);
    const uint64_t size = static_cast<uint64_t>(view.len);
    const uint64_t width = static_cast<uint64_t>(hidden) * itemsize;   // one token of a layer

    struct Copy { uint8_t* dst; const uint8_t* src; uint64_t tokens, width, pitch; };
    std::vector<Copy> copies;
    copies.reserve(rows.size() / 2 * (1 + layers.size() / 2));
    uint64_t total = 0;
    nb::list out;
    for (size_t r = 0; r < rows.size(); r += 2) {
        const int64_t r0 = rows[r], count = rows[r + 1];
        if (r0 < 0 || count < 1) throw nb::value_error("copy_rows: bad row range");
        const uint64_t first_token = static_cast<uint64_t>(r0), n = static_cast<uint64_t>(count);
        // the token ids: int32 [count]
        const uint64_t ids_at = static_cast<uint64_t>(ids_offset) + 4 * first_token;
        if (first_token > (1ULL << 60) || checked_end(ids_at, 4, n, 4) > size)
            throw nb::value_error("copy_rows: token ids past the payload");
        uint8_t* data = nullptr;
        out.append(owned_capsule(DLDataType{kDLInt, 32, 1}, count, 0, 4 * n, &data));
        copies.push_back({data, src + ids_at, 1, 4 * n, 4 * n});
        total += 4 * n;
        // each layer: [count, hidden], C-contiguous
        for (size_t l = 0; l < layers.size(); l += 2) {
            if (layers[l] < 0 || layers[l + 1] < 0) throw nb::value_error("copy_rows: bad layer");
            const uint64_t pitch = static_cast<uint64_t>(layers[l + 1]);
            uint64_t at = 0;
            if (__builtin_mul_overflow(first_token, pitch, &at) ||
                __builtin_add_overflow(at, static_cast<uint64_t>(layers[l]), &at) ||
                pitch < width || checked_end(at, pitch, n, width) > size)
                throw nb::value_error("copy_rows: a layer past the payload");
            out.append(owned_capsule(dtype, count, hidden, n * width, &data));
            if (pitch == width)   // the layer fills its block: the row's tokens are one run
                copies.push_back({data, src + at, 1, n * width, n * width});
            else
                copies.push_back({data, src + at, n, width, pitch});
            total += n * width;
        }
    }
    auto copy_all = [&copies] {
        for (const Copy& c : copies)
            for (uint64_t i = 0; i < c.tokens; ++i)
                std::memcpy(c.dst + i * c.width, c.src + i * c.pitch, c.width);
    };
    if (total >= (1u << 20)) {
        nb::gil_scoped_release unlocked;
        copy_all();
    } else {
        copy_all();
    }
    return out;
}

}  // namespace

NB_MODULE(_meta, m) {
    m.doc() = "The producer's native encoder of batch-entry metas (record.plan_batch's twin, "
              "checked byte for byte against it).";
    // a module-lifetime exception type, deliberately never freed (as CPython's own)
    static PyObject* unsupported =
        PyErr_NewException("hscapture._meta.Unsupported", PyExc_ValueError, nullptr);
    if (!unsupported) throw nb::python_error();
    m.attr("Unsupported") = nb::handle(unsupported);
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const Unsupported&) {
            PyErr_SetString(unsupported, "not encodable natively: use record.plan_batch");
        }
    });
    m.attr("ALIGN") = kAlign;   // record.ALIGN; record.py uses this module only when they agree
    m.def("packb", [](nb::handle obj) {
        Writer w;
        w.pack(obj.ptr(), 0);
        return nb::bytes(w.out.data(), w.out.size());
    }, "obj"_a.none(), "msgpack-python's packb(obj, use_bin_type=True) for exact builtin types; "
                "raises Unsupported for anything else.");
    nb::list dtypes;
    for (const RowDtype& d : kRowDtypes) dtypes.append(d.name);
    m.attr("ROW_DTYPES") = nb::frozenset(dtypes);   // the dtypes copy_rows takes
    m.def("copy_rows", &copy_rows, "payload"_a, "rows"_a, "layers"_a, "hidden"_a,
          "ids_offset"_a, "dtype"_a,
          "Owned copies of whole rows of a batch entry's payload, as DLPack capsules "
          "(torch.from_dlpack takes each): for each row (rows: r0, count, r0, count, ... "
          "token ranges), its int32 token ids [count] (at ids_offset), then each layer "
          "(layers: first, pitch, ...: the byte offset of token 0 of the layer and the bytes "
          "from one token to the next) as a C-contiguous [count, hidden] tensor of dtype (one "
          "of ROW_DTYPES, else Unsupported). Raises ValueError for a range outside the "
          "payload.");
    // (every value may be None: what it packs as is the Python reference's business)
    m.def("plan_batch", &plan_batch, "version"_a, "producer"_a.none(), "epoch"_a.none(),
          "seq"_a.none(), "dp_rank"_a.none(), "layers"_a.none(), "layer_kinds"_a.none(),
          "convention"_a.none(), "model"_a.none(), "hidden"_a.none(), "dtype"_a.none(),
          "itemsize"_a, "rows"_a.none(), "block_cols"_a.none(), "layer_map"_a.none(),
          "record.plan_batch(..., check=False) natively: (meta_bytes, block_offsets, block_bytes, "
          "ids_offset, length, tokens, row_starts, pads); raises Unsupported where only the "
          "Python reference can encode the inputs.");
}
