// hscapture._files: write the row interleaving of K equal buffers to a file descriptor, with
// the kernel doing the only copy.
//
// Why native: the trainers' layouts are token-major (SpecForge's aux_hidden_state [1, T, K*H],
// speculators' hidden_states [T, K, H]) where the shards are layer-major ([T, H] per layer).
// Interleaving into a bounce buffer first costs one more pass over every byte than the raw
// write of the same bytes (results h200-2026-12-02c: export 0.53-0.60x of raw); one iovec per
// (token, layer) row lets writev(2) gather straight from the memory-mapped shards instead, but
// T*K Python memoryviews cost more than the pass they save (0.43x measured). Here the iovecs
// are built in C++ with the GIL released.
//
// With a CRC (writev_rows_crc32: SpecForge's .ckpt is a zip, each record carries the CRC-32 of
// its bytes): from kCrcThreadMin bytes a helper thread takes the CRC of the rows in file order
// while the calling thread writes them, so a file costs max(write, CRC) instead of their sum
// (H100 host, benchmarks/results/h100-2026-12-07e: a write with its CRC took 1.04-1.05 of a raw
// write's time inline, 0.87-0.89 with the helper, which also takes the source map's page
// faults ahead of the writer). Below that, or when no thread can be started,
// each batch of rows is checksummed just before it is written, so the kernel's copy reads it
// from cache; batches are at most ~1 MiB for that reason. Both read the caller's buffers only:
// the helper shares nothing with the writer but the buffers (read-only, held by this call) and
// its result, published to the caller by std::thread::join (join synchronizes-with the
// thread's completion: every store of the helper, the CRC included, happens-before join
// returns).
//
// Safety: every source is held through the buffer protocol for the whole call (the caller
// cannot free it meanwhile) and must be C-contiguous and hold at least (first + rows) rows of
// `row_bytes`; checked before anything is written (ValueError). A write error raises OSError
// with what was written so far in the message; EINTR is retried; short writes are resumed.
#include <nanobind/nanobind.h>

#include <Python.h>

#include "hscapture/crc32.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct ReadBuffer {
    Py_buffer view{};
    bool held = false;
    explicit ReadBuffer(PyObject* obj) {
        if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) != 0) throw nb::python_error();
        held = true;
    }
    ~ReadBuffer() { if (held) PyBuffer_Release(&view); }
    ReadBuffer(const ReadBuffer&) = delete;
    ReadBuffer& operator=(const ReadBuffer&) = delete;
};

#ifdef IOV_MAX
constexpr int kIovMax = IOV_MAX < 1024 ? IOV_MAX : 1024;
#else
constexpr int kIovMax = 1024;
#endif

// Writes every iovec of [iov, iov + n) fully; returns 0 or the errno of the failing writev.
int write_all(int fd, struct iovec* iov, int n, uint64_t* written) {
    while (n > 0) {
        const ssize_t got = ::writev(fd, iov, n < kIovMax ? n : kIovMax);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EIO;
        *written += uint64_t(got);
        size_t left = size_t(got);
        while (n > 0 && left >= iov->iov_len) {   // drop the iovecs written whole
            left -= iov->iov_len;
            ++iov;
            --n;
        }
        if (left) {                               // a short write inside this one: resume it
            iov->iov_base = static_cast<char*>(iov->iov_base) + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

// From this many bytes a CRC is taken by a helper thread beside the write (see the top).
constexpr uint64_t kCrcThreadMin = uint64_t(2) << 20;

// The CRC-32 of rows [first, first + rows) of `k` sources interleaved (token t's row of
// source 0, of source 1, ...), continuing `crc`.
uint32_t crc_rows(const std::vector<std::unique_ptr<ReadBuffer>>& held, uint64_t row_bytes,
                  uint64_t first, uint64_t rows, uint32_t crc) {
    for (uint64_t t = first; t < first + rows; ++t)
        for (const auto& b : held)
            crc = hsc::crc32(crc, static_cast<const char*>(b->view.buf) + t * row_bytes,
                             size_t(row_bytes));
    return crc;
}

// Joins the helper on every way out of the write (an error included): the buffers it reads
// stay held until then.
struct Joiner {
    std::thread t;
    ~Joiner() { if (t.joinable()) t.join(); }
};

// The write itself; with `crc`, *crc is continued over the bytes in file order (by a helper
// thread from `crc_thread_min` bytes, see the top).
uint64_t write_rows(int fd, nb::handle sources, uint64_t row_bytes, uint64_t first,
                    uint64_t rows, uint32_t* crc, uint64_t crc_thread_min = kCrcThreadMin) {
    PyObject* list = sources.ptr();
    if (!PyList_Check(list) || PyList_GET_SIZE(list) == 0)
        throw nb::type_error("writev_rows: sources must be a non-empty list of buffers");
    const Py_ssize_t k = PyList_GET_SIZE(list);
    std::vector<std::unique_ptr<ReadBuffer>> held;
    held.reserve(size_t(k));
    const uint64_t need = (first + rows) * row_bytes;
    for (Py_ssize_t i = 0; i < k; ++i) {
        held.push_back(std::make_unique<ReadBuffer>(PyList_GET_ITEM(list, i)));
        const uint64_t len = uint64_t(held.back()->view.len);
        if (len < need)
            throw nb::value_error(("writev_rows: source " + std::to_string(i) + " holds " +
                                   std::to_string(len) + " bytes, expected at least " +
                                   std::to_string(need) + " (rows [" + std::to_string(first) +
                                   ", " + std::to_string(first + rows) + ") of " +
                                   std::to_string(row_bytes) + " bytes)").c_str());
    }
    if (row_bytes == 0 || rows == 0) return 0;
    uint64_t written = 0;
    int err = 0;
    {
        nb::gil_scoped_release nogil;   // the buffers stay held (and valid) until we return
        Joiner helper;                  // declared after `held`: joined before they are released
        uint32_t side_crc = 0;          // the helper's result; read only after the join
        if (crc && rows * row_bytes * uint64_t(k) >= crc_thread_min) {
            const uint32_t start = *crc;
            try {
                helper.t = std::thread([&held, &side_crc, row_bytes, first, rows, start] {
                    side_crc = crc_rows(held, row_bytes, first, rows, start);
                });
            } catch (const std::system_error&) {
                // no thread to be had (a process at its limit): the CRC inline, batch by batch
            }
        }
        const bool inline_crc = crc && !helper.t.joinable();
        // one batch of whole tokens at a time (token t's row of source 0, of source 1, ...):
        // at most kIovMax iovecs, and with an inline CRC at most ~1 MiB (still in cache when
        // written)
        uint64_t per = uint64_t(kIovMax) / uint64_t(k);
        if (inline_crc) {
            const uint64_t fit = (uint64_t(1) << 20) / (uint64_t(k) * row_bytes);
            if (fit < per) per = fit;
        }
        if (per == 0) per = 1;
        std::vector<struct iovec> iov(size_t(per * uint64_t(k)));
        for (uint64_t t0 = first; t0 < first + rows && !err; t0 += per) {
            const uint64_t n = (first + rows - t0) < per ? (first + rows - t0) : per;
            size_t j = 0;
            for (uint64_t t = t0; t < t0 + n; ++t)
                for (Py_ssize_t s = 0; s < k; ++s) {
                    iov[j].iov_base = static_cast<char*>(held[size_t(s)]->view.buf) + t * row_bytes;
                    iov[j].iov_len = size_t(row_bytes);
                    ++j;
                }
            if (inline_crc)   // this batch's rows, just before the kernel copies them
                *crc = crc_rows(held, row_bytes, t0, n, *crc);
            err = write_all(fd, iov.data(), int(j), &written);
        }
        if (helper.t.joinable()) {
            helper.t.join();            // side_crc is the helper's, complete (see the top)
            *crc = side_crc;
        }
    }
    if (err) {   // OSError(errno, message): .errno is set (ENOSPC: a full disk), the subclass too
        const std::string msg = "writev_rows: " + std::string(strerror(err)) + " after " +
                                std::to_string(written) + " of " +
                                std::to_string(rows * row_bytes * uint64_t(k)) + " bytes";
        PyObject* args = Py_BuildValue("(is)", err, msg.c_str());
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
        throw nb::python_error();
    }
    return written;
}

uint64_t writev_rows(int fd, nb::handle sources, uint64_t row_bytes, uint64_t first,
                     uint64_t rows) {
    return write_rows(fd, sources, row_bytes, first, rows, nullptr);
}

nb::tuple writev_rows_crc32(int fd, nb::handle sources, uint64_t row_bytes, uint64_t first,
                            uint64_t rows, uint32_t crc, uint64_t crc_thread_min) {
    const uint64_t written = write_rows(fd, sources, row_bytes, first, rows, &crc,
                                        crc_thread_min);
    return nb::make_tuple(written, crc);
}

uint32_t crc32(nb::handle data, uint32_t value, const char* impl) {
    ReadBuffer b(data.ptr());
    if (std::strcmp(impl, "auto") != 0) {
        uint32_t out = 0;
        if (!hsc::crc32_by(impl, value, b.view.buf, size_t(b.view.len), &out))
            throw nb::value_error(("crc32: implementation '" + std::string(impl) +
                                   "' is unknown or not supported by this CPU (expected "
                                   "auto, table, pclmul or vpclmul; this CPU's best: " +
                                   hsc::crc32_impl() + ")").c_str());
        return out;
    }
    if (b.view.len < (Py_ssize_t(1) << 16)) return hsc::crc32(value, b.view.buf, size_t(b.view.len));
    nb::gil_scoped_release nogil;
    return hsc::crc32(value, b.view.buf, size_t(b.view.len));
}

}  // namespace

NB_MODULE(_files, m) {
    m.doc() = "Row-interleaved writes of equal buffers to a file descriptor, and CRC-32 (the exports).";
    m.attr("IOV_MAX") = kIovMax;
    m.def("writev_rows", &writev_rows, "fd"_a, "sources"_a, "row_bytes"_a, "first"_a, "rows"_a,
          "Write rows [first, first + rows) of the K buffers in `sources` interleaved (row t of "
          "source 0, of source 1, ..., then row t + 1) to `fd` at its current offset, each row "
          "`row_bytes` bytes; returns the bytes written (all of them, or OSError). The GIL is "
          "released while writing.");
    m.def("writev_rows_crc32", &writev_rows_crc32, "fd"_a, "sources"_a, "row_bytes"_a,
          "first"_a, "rows"_a, "crc"_a = 0, "crc_thread_min"_a = kCrcThreadMin,
          "writev_rows, also continuing the CRC-32 `crc` over the bytes written, in file order: "
          "returns (bytes written, CRC-32), the CRC equal to zlib.crc32(bytes, crc). From "
          "`crc_thread_min` bytes (CRC_THREAD_MIN by default) a helper thread takes the CRC "
          "while this one writes; below it each ~1 MiB batch is checksummed just before its "
          "write.");
    m.def("crc32", &crc32, "data"_a, "value"_a = 0, "impl"_a = "auto",
          "zlib.crc32(data, value) of a C-contiguous buffer (PCLMUL folding where the CPU has "
          "it; the GIL released from 64 KiB). `impl` names one implementation (table, pclmul, "
          "vpclmul: the tests'; ValueError where this CPU lacks it).");
    m.attr("CRC32_IMPL") = hsc::crc32_impl();
    m.attr("CRC_THREAD_MIN") = kCrcThreadMin;
}
