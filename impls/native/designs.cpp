// The article's three BlockManager designs and flat-rows in C++, behind the contract of impls/contract.py, one foreign
// call per operation.
//
//   kind 0  cpp-dict  design A: std::unordered_map per sequence (logical -> physical), ref counts in an
//                     unordered_map holding only blocks in use, the free pool a std::vector used as a stack;
//   kind 1  cpp-list  design B: std::vector per sequence grown by push_back (the standard growth policy), ref
//                     counts a vector indexed by block id, the free pool a vector used as a stack;
//   kind 2  cpp-flat  design C: one preallocated [max_seqs * max_blocks_per_seq] table of uint16 ids (uint32
//                     above 65,536 blocks), ref counts and a free-block stack in preallocated int32 arrays;
//   kind 3  cpp-flat-rows  flat-rows (impls/designs/flat_rows.py): C's table in two levels, per sequence a
//                     directory of 64-byte rows of 32 uint16 ids (16 uint32 above 65,536 blocks) drawn from a
//                     preallocated row pool; forks share rows, a write into a shared row copies it first.
//
// Validation (argument ranges, sequence state, capacity, pool; in the contract's order and before any change)
// and the batched decode step's whole-step validation and worst-case reservation are written once, in
// Manager<D>, so the designs differ only in their data structures, as the Python designs do.
//
// Every container allocates through CountingAllocator, which counts allocation calls in g_allocs (and their
// bytes in g_alloc_bytes). The extern
// "C" functions never let an exception escape (E_OOM instead) and never write past a buffer whose capacity
// they were given. The status codes (kvb::OK, kvb::E_*) come from impls/contract.py, in a prelude the build
// puts before this file (impls/native/toolchain.py). Timed replays are the harness's (harness/base/
// native_replay.cpp): it calls the kvb_* functions below through their addresses, one call per operation.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#define KVB_API extern "C" __attribute__((visibility("default")))

namespace {

using namespace kvb;  // the contract's codes (the generated prelude)

int64_t g_allocs = 0;       // allocation calls made by the containers (single-threaded use)
int64_t g_alloc_bytes = 0;  // bytes those calls asked for (what a constructor allocates, checked by the tests)

template <class T>
struct CountingAllocator {
    using value_type = T;
    CountingAllocator() noexcept = default;
    template <class U>
    CountingAllocator(const CountingAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        ++g_allocs;
        g_alloc_bytes += static_cast<int64_t>(n * sizeof(T));
        if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__)  // flat-rows' cache-line rows
            return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignof(T)}));
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t) noexcept {
        if constexpr (alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__)
            ::operator delete(p, std::align_val_t{alignof(T)});
        else
            ::operator delete(p);
    }
    template <class U>
    bool operator==(const CountingAllocator<U>&) const noexcept { return true; }
    template <class U>
    bool operator!=(const CountingAllocator<U>&) const noexcept { return false; }
};

template <class T>
using Vec = std::vector<T, CountingAllocator<T>>;
template <class K, class V>
using Map = std::unordered_map<K, V, std::hash<K>, std::equal_to<K>, CountingAllocator<std::pair<const K, V>>>;

struct Config {
    int64_t num_blocks, block_size, shift, max_seqs, max_blocks;
};

// What every design shares: configuration, per-row lengths (0 = inactive) and the contract's checks.
struct Rec {
    int32_t len;   // tokens (0 = inactive)
    int32_t mark;  // duplicate detection in a decode step without allocating
};
struct FlatRec {  // C's: one base and one 16-byte record for everything its decode step reads per sequence
    int32_t len;
    int32_t mark;
    int64_t next;  // impls/designs/flat.py's NEXT (FlatDesign)
};

template <class R = Rec>
struct Common {
    Config c;
    Vec<R> recs;  // one record per sequence
    int32_t stamp = 0;

    explicit Common(const Config& cfg) : c(cfg), recs(cfg.max_seqs, R{}) {}

    int64_t blocks_for(int64_t tokens) const { return (tokens + c.block_size - 1) >> c.shift; }
    int64_t slot_of(int64_t block, int64_t pos) const { return (block << c.shift) | (pos & (c.block_size - 1)); }
    bool in_range(int64_t seq) const { return seq >= 0 && seq < c.max_seqs; }

    int64_t check_active(int64_t seq) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        return recs[seq].len == 0 ? E_INACTIVE : OK;
    }
    int64_t check_allocate(int64_t seq, int64_t tokens) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        if (tokens < 1) return E_TOKENS;
        if (tokens > c.max_blocks * c.block_size) return E_TOO_LONG;  // blocks_for(tokens) > max_blocks
        return recs[seq].len != 0 ? E_ACTIVE : OK;
    }
    int64_t check_append(int64_t seq) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        int64_t n = recs[seq].len;
        if (n == 0) return E_INACTIVE;
        if ((n & (c.block_size - 1)) == 0 && (n >> c.shift) >= c.max_blocks) return E_TOO_LONG;
        return OK;
    }
    int64_t check_fork(int64_t parent, int64_t child) const {
        if (!in_range(parent) || !in_range(child)) return E_SEQ_RANGE;
        if (recs[parent].len == 0) return E_INACTIVE;
        return recs[child].len != 0 ? E_ACTIVE : OK;
    }
    int64_t rows_in_use() const { return 0; }  // designs without a row pool (flat-rows has one)
    static constexpr bool FUSED_STEP = false;  // true: the design's own one-pass decode step (C's)
    void allocated(int64_t) {}  // after allocate set the row's length
    void forked(int64_t) {}     // after fork shared the parent's blocks
    int32_t next_stamp() {
        if (stamp == INT32_MAX) {
            for (R& r : recs) r.mark = 0;
            stamp = 0;
        }
        return ++stamp;
    }
};

// The free blocks of designs A and B: a stack, back() handed out next, every block free at the start.
struct FreeStack {
    Vec<int32_t> blocks;

    explicit FreeStack(int64_t num_blocks) {
        blocks.reserve(num_blocks);
        for (int64_t b = num_blocks - 1; b >= 0; --b) blocks.push_back(static_cast<int32_t>(b));
    }
    int64_t size() const { return static_cast<int64_t>(blocks.size()); }
    void push_back(int32_t b) { blocks.push_back(b); }
    template <class Refs>
    int32_t take(Refs& refs) {  // the next block handed out, its count 1
        int32_t b = blocks.back();
        blocks.pop_back();
        refs[b] = 1;
        return b;
    }
};

// ---- design A: a hash map per sequence -------------------------------------------------------------------
struct DictDesign : Common<> {
    using Table = Map<int32_t, int32_t>;
    Map<int32_t, Table> tables;  // row -> (logical -> physical); a new map per allocate, erased on free
    Map<int32_t, int32_t> refs;  // only blocks in use
    FreeStack free_list;

    explicit DictDesign(const Config& cfg) : Common(cfg), free_list(cfg.num_blocks) {}
    int64_t num_free() const { return free_list.size(); }
    int32_t take() { return free_list.take(refs); }
    void take_table(int64_t seq, int64_t need) {
        Table& t = tables[static_cast<int32_t>(seq)];
        for (int32_t j = 0; j < need; ++j) {
            int32_t b = take();
            t[j] = b;
        }
    }
    bool last_shared(int64_t seq) {
        Table& t = tables.find(static_cast<int32_t>(seq))->second;
        return refs.find(t.find(static_cast<int32_t>(t.size()) - 1)->second)->second > 1;
    }
    int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t n = recs[seq].len;
        recs[seq].len = static_cast<int32_t>(n + 1);
        Table& t = tables.find(static_cast<int32_t>(seq))->second;
        if ((n & (c.block_size - 1)) == 0) {
            int32_t b = take();
            t.emplace(static_cast<int32_t>(t.size()), b);
            return 0;
        }
        auto last = t.find(static_cast<int32_t>(t.size()) - 1);
        int32_t src = last->second;
        auto r = refs.find(src);
        if (r->second == 1) return 0;
        r->second -= 1;
        int32_t dst = take();
        last->second = dst;
        *src_out = src;
        *dst_out = dst;
        return 1;
    }
    void fork_table(int64_t parent, int64_t child) {
        const Table& t = tables.find(static_cast<int32_t>(parent))->second;
        for (const auto& kv : t) refs.find(kv.second)->second += 1;
        Table copy(t);
        tables.emplace(static_cast<int32_t>(child), std::move(copy));
    }
    void free_table(int64_t seq) {
        auto it = tables.find(static_cast<int32_t>(seq));
        Table t = std::move(it->second);
        tables.erase(it);
        for (int32_t j = static_cast<int32_t>(t.size()) - 1; j >= 0; --j) {
            int32_t b = t.find(j)->second;
            auto r = refs.find(b);
            if (r->second == 1) {
                refs.erase(r);
                free_list.push_back(b);
            } else {
                r->second -= 1;
            }
        }
    }
    int64_t block_at(int64_t seq, int64_t j) {
        return tables.find(static_cast<int32_t>(seq))->second.find(static_cast<int32_t>(j))->second;
    }
    int64_t ref(int64_t b) const {
        auto r = refs.find(static_cast<int32_t>(b));
        return r == refs.end() ? 0 : r->second;
    }
    int64_t table_nbytes(int64_t seq) {
        // The map object, its bucket array and its nodes (next pointer + key/value pair), before malloc rounding.
        const Table& t = tables.find(static_cast<int32_t>(seq))->second;
        return static_cast<int64_t>(sizeof(Table) + t.bucket_count() * sizeof(void*) +
                                    t.size() * (sizeof(void*) + sizeof(std::pair<const int32_t, int32_t>)));
    }
    int64_t id_bytes() const { return 4; }
};

// ---- design B: a growable vector per sequence ------------------------------------------------------------
struct ListDesign : Common<> {
    using Table = Vec<int32_t>;
    std::vector<Table, CountingAllocator<Table>> tables;  // per row; empty (no storage) when inactive
    Vec<int32_t> refs;
    FreeStack free_list;

    explicit ListDesign(const Config& cfg)
        : Common(cfg), tables(cfg.max_seqs), refs(cfg.num_blocks, 0), free_list(cfg.num_blocks) {}
    int64_t num_free() const { return free_list.size(); }
    int32_t take() { return free_list.take(refs); }
    void take_table(int64_t seq, int64_t need) {
        Table t;
        t.reserve(need);  // the prompt's blocks in one allocation; decode appends grow it by push_back
        for (int64_t j = 0; j < need; ++j) t.push_back(take());
        tables[seq] = std::move(t);
    }
    bool last_shared(int64_t seq) { return refs[tables[seq].back()] > 1; }
    int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t n = recs[seq].len;
        recs[seq].len = static_cast<int32_t>(n + 1);
        Table& t = tables[seq];
        if ((n & (c.block_size - 1)) == 0) {
            t.push_back(take());
            return 0;
        }
        int32_t src = t.back();
        if (refs[src] == 1) return 0;
        refs[src] -= 1;
        int32_t dst = take();
        t.back() = dst;
        *src_out = src;
        *dst_out = dst;
        return 1;
    }
    void fork_table(int64_t parent, int64_t child) {
        for (int32_t b : tables[parent]) refs[b] += 1;
        tables[child] = tables[parent];
    }
    void free_table(int64_t seq) {
        Table t;
        t.swap(tables[seq]);  // the row keeps no storage, like the Python design's None
        for (auto it = t.rbegin(); it != t.rend(); ++it) {
            if (--refs[*it] == 0) free_list.push_back(*it);
        }
    }
    int64_t block_at(int64_t seq, int64_t j) { return tables[seq][j]; }
    int64_t ref(int64_t b) const { return refs[b]; }
    int64_t table_nbytes(int64_t seq) {
        // The vector object and its capacity (the growth policy's spare room included).
        return static_cast<int64_t>(sizeof(Table) + tables[seq].capacity() * sizeof(int32_t));
    }
    int64_t id_bytes() const { return 4; }
};

// ---- preallocated pools of ids with ref counts (C's blocks; flat-rows' blocks and rows) ------------------
struct Pool {
    Vec<int32_t> refs;
    Vec<int32_t> stack;  // the free ids; stack[top - 1] is handed out next
    int64_t top;

    explicit Pool(int64_t n) : refs(n, 0), stack(n), top(n) {
        for (int64_t i = 0; i < n; ++i) stack[i] = static_cast<int32_t>(n - 1 - i);  // hands out 0, 1, 2, ...
    }
    int32_t take() {
        int32_t x = stack[--top];
        refs[x] = 1;
        return x;
    }
    void release(int32_t x) {
        if (--refs[x] == 0) stack[top++] = x;
    }
    // take() for ids[0..n), and release() for ids[n-1] down to ids[0], with the stack's top and both arrays
    // held in registers (through the members, the compiler reloads them after every store).
    template <class Id>
    void take_into(Id* ids, int64_t n) {
        int32_t *s = stack.data(), *r = refs.data();
        int64_t t = top;
        for (int64_t j = 0; j < n; ++j) {
            int32_t x = s[--t];
            r[x] = 1;
            ids[j] = static_cast<Id>(x);
        }
        top = t;
    }
    template <class Id>
    void release_from(const Id* ids, int64_t n) {
        int32_t *s = stack.data(), *r = refs.data();
        int64_t t = top;
        for (int64_t j = n - 1; j >= 0; --j) {
            int32_t x = static_cast<int32_t>(ids[j]);
            if (--r[x] == 0) s[t++] = x;
        }
        top = t;
    }
};

// ---- design C: a flat preallocated table and a free-block stack ------------------------------------------
template <class Id>
struct FlatDesign : Common<FlatRec> {
    Vec<Id> table;  // [max_seqs * max_blocks], row-major
    Pool blocks;
    // recs[seq].next, as flat's NEXT (impls/designs/flat.py): the slot of row seq's next token while that token
    // needs no new block and no copy, else a value with the offset bits clear (0 for an inactive row).
    Vec<int64_t> step_slots;  // a decode step's slots and copy-on-write pairs, copied out when it succeeds
    Vec<int64_t> step_cows;
    static constexpr bool FUSED_STEP = true;

    explicit FlatDesign(const Config& cfg)
        : Common(cfg), table(cfg.max_seqs * cfg.max_blocks, 0), blocks(cfg.num_blocks),
          step_slots(cfg.max_seqs, 0), step_cows(2 * cfg.max_seqs, 0) {}
    Id* row(int64_t seq) { return table.data() + seq * c.max_blocks; }
    int64_t num_free() const { return blocks.top; }
    void take_table(int64_t seq, int64_t need) { blocks.take_into(row(seq), need); }
    // The row's NEXT for its length, its last block its own.
    void keep_next(int64_t seq) {
        int64_t n = recs[seq].len, off = n & (c.block_size - 1);
        recs[seq].next = off != 0 ? (static_cast<int64_t>(row(seq)[n >> c.shift]) << c.shift) | off : 0;
    }
    void allocated(int64_t seq) { keep_next(seq); }
    void forked(int64_t parent) { recs[parent].next = 0; }  // its last block is shared now (the child's NEXT is 0)
    bool last_shared(int64_t seq) { return blocks.refs[row(seq)[(recs[seq].len - 1) >> c.shift]] > 1; }
    int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t b = append_block(seq, recs[seq].len, src_out, dst_out);
        recs[seq].len += 1;
        keep_next(seq);
        return b < 0 ? 1 : 0;
    }
    // Row seq's block for its token m (a new one at a boundary, a copy of a shared one): the block, or -block - 1
    // after a copy-on-write (the pair written).
    int64_t append_block(int64_t seq, int64_t m, int64_t* src_out, int64_t* dst_out) {
        Id* r = row(seq);
        int64_t j = m >> c.shift;
        if ((m & (c.block_size - 1)) == 0) return r[j] = static_cast<Id>(blocks.take());
        int32_t src = r[j];
        if (blocks.refs[src] == 1) return src;
        blocks.refs[src] -= 1;
        int32_t dst = blocks.take();
        r[j] = static_cast<Id>(dst);
        *src_out = src;
        *dst_out = dst;
        return -static_cast<int64_t>(dst) - 1;
    }
    // The batched step in one pass, validation, append and slot fused (the caller has checked the buffers and
    // that the pool holds n blocks), as flat's decode_step: a row whose NEXT holds costs its checks and its
    // writes; the others also read the table, the stack and the ref counts. A bad id undoes the appends already
    // made; slots and copy-on-write pairs reach the caller's buffers only when the step succeeds.
    template <class I>
    int64_t fused_step(const I* ids, int64_t n, int64_t* cow, int64_t* slots, int64_t* detail) {
        const int32_t mark = next_stamp();
        const int64_t mask = c.block_size - 1, rows = c.max_seqs;
        FlatRec* rec = recs.data();
        int64_t *out = step_slots.data(), *pairs = step_cows.data();
        int64_t rc = OK, cows = 0, i = 0;
        for (; i < n; ++i) {
            int64_t seq = ids[i];
            if (__builtin_expect(static_cast<uint64_t>(seq) >= static_cast<uint64_t>(rows), 0)) {
                rc = E_SEQ_RANGE;
                break;
            }
            if (__builtin_expect(rec[seq].mark == mark, 0)) {
                rc = E_DUPLICATE;
                break;
            }
            int64_t slot = rec[seq].next;
            if (__builtin_expect((slot & mask) == 0, 0)) {
                slot = slow_slot(&rec[seq], pairs, cows);
                if (slot < 0) {
                    rc = slot;
                    break;
                }
            }
            rec[seq].mark = mark;
            rec[seq].len += 1;
            rec[seq].next = slot + 1;
            out[i] = slot;
        }
        if (rc != OK) {
            undo(ids, i, cows);
            *detail = i;
            return rc;
        }
        std::copy(out, out + n, slots);
        std::copy(pairs, pairs + 2 * cows, cow);
        return cows;
    }
    // The slot of row seq's next token when its NEXT does not hold: a boundary (empty and full rows too: the
    // length checks live only here), a shared last block, or a row another operation changed. A negative code
    // when the append is refused; a copy-on-write's pair goes to pairs[2 * cows] and counts in cows. Out of
    // line: its registers would otherwise crowd the common path's.
    __attribute__((noipa)) int64_t slow_slot(FlatRec* r, int64_t* pairs, int64_t& cows) {
        int64_t seq = r - recs.data(), m = r->len, off = m & (c.block_size - 1);
        if (off == 0) {
            if (m == 0) return E_INACTIVE;
            if ((m >> c.shift) >= c.max_blocks) return E_TOO_LONG;
        }
        int64_t b = append_block(seq, m, &pairs[2 * cows], &pairs[2 * cows + 1]);
        if (b < 0) {
            b = -b - 1;
            ++cows;
        }
        return (b << c.shift) | off;
    }
    // Undo the first count appends of a failed fused_step, newest first: a boundary's new block and a copy go
    // back to the stack (still there, above its top), a copied source regains its place and its reference.
    template <class I>
    void undo(const I* ids, int64_t count, int64_t cows) {
        for (int64_t k = count - 1; k >= 0; --k) {
            int64_t seq = ids[k], m = --recs[seq].len, j = m >> c.shift;
            recs[seq].next = 0;
            Id* r = row(seq);
            if ((m & (c.block_size - 1)) == 0) {
                blocks.refs[r[j]] = 0;
                blocks.top += 1;
            } else if (cows > 0 && r[j] == step_cows[2 * cows - 1]) {
                --cows;
                int32_t src = static_cast<int32_t>(step_cows[2 * cows]);
                blocks.refs[r[j]] = 0;
                blocks.top += 1;
                r[j] = static_cast<Id>(src);
                blocks.refs[src] += 1;
            }
        }
    }
    void fork_table(int64_t parent, int64_t child) {
        const Id* p = row(parent);
        Id* ch = row(child);
        for (int64_t j = 0, n = blocks_for(recs[parent].len); j < n; ++j) {
            ch[j] = p[j];
            blocks.refs[p[j]] += 1;
        }
    }
    void free_table(int64_t seq) {
        blocks.release_from(row(seq), blocks_for(recs[seq].len));
        recs[seq].next = 0;
    }
    int64_t block_at(int64_t seq, int64_t j) { return row(seq)[j]; }
    int64_t ref(int64_t b) const { return blocks.refs[b]; }
    int64_t table_nbytes(int64_t) { return static_cast<int64_t>(sizeof(Id)) * c.max_blocks; }  // one row
    int64_t id_bytes() const { return sizeof(Id); }
};

// ---- flat-rows: C's table in two levels, 64-byte rows from a preallocated row pool -----------------------

// The pool's rows (impls/designs/flat_rows.py, row_count: its docstring proves they cover any sequence of calls):
// num_blocks / ids_per_row + 2 * max_seqs, or every directory full if that is fewer.
int64_t row_count(int64_t num_blocks, int64_t max_seqs, int64_t max_blocks) {
    int64_t ids = ROW_BYTES / (num_blocks <= UINT16_LIMIT ? 2 : 4);
    return std::min(max_seqs * ((max_blocks + ids - 1) / ids), num_blocks / ids + 2 * max_seqs);
}

[[noreturn]] void row_pool_exhausted() {
    // Unreachable: the pool holds the worst case (row_count). A bug must never write outside the rows.
    std::fputs("kvb: flat-rows' row pool is exhausted, a bug in cpp-flat-rows\n", stderr);
    std::abort();
}

// flat-rows' block-level behaviour is C's (the same ids for the same calls); rows are taken, shared and copied
// as flat-rows takes them, so both hold the same rows. flat-rows keeps a shared bit per sequence and the row of
// its last block in the sequence's record; here the row ref count says whether the last row is shared and the
// directory entry (one load, as the record's) says where it is.
template <class Id>
struct FlatRowsDesign : Common<> {
    static constexpr int64_t IDS = ROW_BYTES / sizeof(Id);  // ids per row
    static constexpr int64_t ROW_SHIFT = IDS == 32 ? 5 : 4;
    static constexpr int64_t MASK = IDS - 1;
    struct alignas(ROW_BYTES) Row {
        Id ids[IDS];
    };
    static_assert(sizeof(Row) == ROW_BYTES && (int64_t{1} << ROW_SHIFT) == IDS, "a row is one cache line of ids");

    int64_t dir_len;  // directory entries per sequence: ceil(max_blocks / IDS)
    Vec<Row> rows;
    Vec<int32_t> dirs;  // [max_seqs * dir_len] row indices
    Pool blocks;
    Pool row_pool;

    explicit FlatRowsDesign(const Config& cfg)
        : Common(cfg), dir_len((cfg.max_blocks + MASK) >> ROW_SHIFT),
          rows(row_count(cfg.num_blocks, cfg.max_seqs, cfg.max_blocks)), dirs(cfg.max_seqs * dir_len, 0),
          blocks(cfg.num_blocks), row_pool(static_cast<int64_t>(rows.size())) {}
    int32_t* dir(int64_t seq) { return dirs.data() + seq * dir_len; }
    Id* ids(int32_t row) { return rows[row].ids; }
    int64_t rows_for(int64_t nblocks) const { return (nblocks + MASK) >> ROW_SHIFT; }
    int32_t take_row() {
        if (row_pool.top == 0) row_pool_exhausted();
        return row_pool.take();
    }
    // A private copy of the shared row ``row`` (its first ``used`` ids) for the sequence about to write into it.
    // Block ref counts do not change: the copy holds the blocks for this sequence as the original did.
    int32_t copy_row(int32_t row, int64_t used) {
        int32_t copy = take_row();
        std::copy(ids(row), ids(row) + used, ids(copy));
        row_pool.refs[row] -= 1;  // shared: at least 2, never freed here
        return copy;
    }
    int64_t num_free() const { return blocks.top; }
    int64_t rows_in_use() const { return static_cast<int64_t>(rows.size()) - row_pool.top; }
    void take_table(int64_t seq, int64_t need) {
        int32_t* d = dir(seq);
        Id* r = nullptr;
        for (int64_t j = 0; j < need; ++j) {
            int32_t b = blocks.take();
            if ((j & MASK) == 0) r = ids(d[j >> ROW_SHIFT] = take_row());
            r[j & MASK] = static_cast<Id>(b);
        }
    }
    bool last_shared(int64_t seq) { return blocks.refs[block_at(seq, (recs[seq].len - 1) >> c.shift)] > 1; }
    // Inlined into the step's loop as C's is (GCC leaves this larger body out of line otherwise).
    __attribute__((always_inline)) int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t n = recs[seq].len;
        recs[seq].len = static_cast<int32_t>(n + 1);
        int64_t j = n >> c.shift, col = j & MASK;
        int32_t& row = dir(seq)[j >> ROW_SHIFT];
        if ((n & (c.block_size - 1)) == 0) {  // a new block: in a fresh row when it opens one
            int32_t b = blocks.take();
            if (col == 0) {
                row = take_row();
            } else if (row_pool.refs[row] != 1) {
                row = copy_row(row, col);
            }
            ids(row)[col] = static_cast<Id>(b);
            return 0;
        }
        int32_t src = ids(row)[col];
        if (blocks.refs[src] == 1) return 0;
        if (row_pool.refs[row] != 1) row = copy_row(row, col + 1);
        blocks.refs[src] -= 1;
        int32_t dst = blocks.take();
        ids(row)[col] = static_cast<Id>(dst);
        *src_out = src;
        *dst_out = dst;
        return 1;
    }
    void fork_table(int64_t parent, int64_t child) {
        const int32_t* p = dir(parent);
        int32_t* ch = dir(child);
        int64_t n = blocks_for(recs[parent].len);
        for (int64_t k = 0, nrows = rows_for(n); k < nrows; ++k) {  // the child shares the parent's rows
            ch[k] = p[k];
            row_pool.refs[p[k]] += 1;
            const Id* r = ids(p[k]);
            for (int64_t col = 0, used = std::min(IDS, n - (k << ROW_SHIFT)); col < used; ++col) blocks.refs[r[col]] += 1;
        }
    }
    void free_table(int64_t seq) {
        const int32_t* d = dir(seq);
        int64_t n = blocks_for(recs[seq].len);
        for (int64_t k = rows_for(n) - 1; k >= 0; --k) {  // rows and their blocks tail first, as C frees
            const Id* r = ids(d[k]);
            for (int64_t col = std::min(IDS, n - (k << ROW_SHIFT)) - 1; col >= 0; --col) blocks.release(r[col]);
            row_pool.release(d[k]);
        }
    }
    int64_t block_at(int64_t seq, int64_t j) { return ids(dir(seq)[j >> ROW_SHIFT])[j & MASK]; }
    int64_t ref(int64_t b) const { return blocks.refs[b]; }
    int64_t table_nbytes(int64_t seq) {
        // The sequence's directory (preallocated) and the rows it points at (a shared row counts for each).
        return static_cast<int64_t>(sizeof(int32_t)) * dir_len + ROW_BYTES * rows_for(blocks_for(recs[seq].len));
    }
    int64_t id_bytes() const { return sizeof(Id); }
};

// ---- the contract, once for every design -----------------------------------------------------------------
template <class D>
struct Manager : D {
    explicit Manager(const Config& cfg) : D(cfg) {}

    bool needs_block(int64_t seq) { return (this->recs[seq].len & (this->c.block_size - 1)) == 0 || this->last_shared(seq); }

    int64_t can_allocate(int64_t n) const {
        if (n < 0) return E_COUNT;
        return this->num_free() >= n ? 1 : 0;
    }
    int64_t allocate(int64_t seq, int64_t tokens) {
        int64_t rc = this->check_allocate(seq, tokens);
        if (rc != OK) return rc;
        int64_t need = this->blocks_for(tokens);
        if (need > this->num_free()) return E_NO_BLOCKS;
        this->take_table(seq, need);
        this->recs[seq].len = static_cast<int32_t>(tokens);
        this->allocated(seq);
        return OK;
    }
    // 1 on copy-on-write (src, dst written), 0 otherwise, < 0 an error.
    int64_t append(int64_t seq, int64_t* src, int64_t* dst) {
        int64_t rc = this->check_append(seq);
        if (rc != OK) return rc;
        if (this->num_free() == 0 && needs_block(seq)) return E_NO_BLOCKS;
        return this->append_unchecked(seq, src, dst);
    }
    int64_t fork(int64_t parent, int64_t child) {
        int64_t rc = this->check_fork(parent, child);
        if (rc != OK) return rc;
        this->fork_table(parent, child);
        this->recs[child].len = this->recs[parent].len;
        this->forked(parent);
        return OK;
    }
    int64_t free(int64_t seq) {
        int64_t rc = this->check_active(seq);
        if (rc != OK) return rc;
        this->free_table(seq);
        this->recs[seq].len = 0;
        return OK;
    }
    int64_t last_slot_unchecked(int64_t seq) {
        int64_t m = this->recs[seq].len - 1;
        return this->slot_of(this->block_at(seq, m >> this->c.shift), m);
    }
    int64_t last_slot(int64_t seq) {
        int64_t rc = this->check_active(seq);
        return rc != OK ? rc : last_slot_unchecked(seq);
    }
    // Returns the number of copy-on-writes, or < 0 with *detail the offending index (or blocks needed / batch).
    template <class I>
    int64_t decode_step(const I* ids, int64_t n, int64_t* cow, int64_t cow_cap, int64_t* slots, int64_t slot_cap,
                        int64_t* detail) {
        *detail = 0;
        if (slot_cap < n || cow_cap < n) {
            *detail = n;
            return E_BUFFER;
        }
        if constexpr (D::FUSED_STEP) {
            if (n <= this->num_free()) return this->fused_step(ids, n, cow, slots, detail);
        }
        int32_t mark = this->next_stamp();
        for (int64_t i = 0; i < n; ++i) {  // the whole step first, before changing anything
            int64_t seq = ids[i];
            int64_t rc = this->check_append(seq);
            if (rc == OK && this->recs[seq].mark == mark) rc = E_DUPLICATE;
            if (rc != OK) {
                *detail = i;
                return rc;
            }
            this->recs[seq].mark = mark;
        }
        if (n > this->num_free()) {  // only a tight pool needs the exact worst case
            int64_t need = 0;
            for (int64_t i = 0; i < n; ++i) need += needs_block(ids[i]);
            if (need > this->num_free()) {
                *detail = need;
                return E_NO_BLOCKS;
            }
        }
        int64_t cows = 0;
        for (int64_t i = 0; i < n; ++i) {
            int64_t seq = ids[i];
            if (this->append_unchecked(seq, &cow[2 * cows], &cow[2 * cows + 1])) ++cows;
            slots[i] = last_slot_unchecked(seq);
        }
        return cows;
    }
    template <class I>
    int64_t lookup(const I* ids, int64_t n, int64_t* slots, int64_t slot_cap, int64_t* detail) {
        *detail = 0;
        if (slot_cap < n) {
            *detail = n;
            return E_BUFFER;
        }
        for (int64_t i = 0; i < n; ++i) {
            int64_t rc = this->check_active(ids[i]);
            if (rc != OK) {
                *detail = i;
                return rc;
            }
            slots[i] = last_slot_unchecked(ids[i]);
        }
        return OK;
    }
    int64_t seq_len(int64_t seq) const { return this->in_range(seq) ? this->recs[seq].len : E_SEQ_RANGE; }
    int64_t block_table(int64_t seq, int64_t* out, int64_t cap) {
        int64_t rc = this->check_active(seq);
        if (rc != OK) return rc;
        int64_t n = this->blocks_for(this->recs[seq].len);
        if (n > cap) return E_BUFFER;
        for (int64_t j = 0; j < n; ++j) out[j] = this->block_at(seq, j);
        return n;
    }
    int64_t ref_count(int64_t b) const { return (b < 0 || b >= this->c.num_blocks) ? E_BLOCK_RANGE : this->ref(b); }
    int64_t nbytes(int64_t seq) {
        int64_t rc = this->check_active(seq);
        return rc != OK ? rc : this->table_nbytes(seq);
    }
};

// ---- handles and dispatch -------------------------------------------------------------------------------
enum : int { KIND_DICT = 0, KIND_LIST = 1, KIND_FLAT = 2, KIND_FLAT_ROWS = 3 };

struct Handle {
    int kind;  // 0 dict, 1 list, 2 flat uint16, 3 flat uint32, 4 flat-rows uint16, 5 flat-rows uint32
    void* p;
};

using MDict = Manager<DictDesign>;
using MList = Manager<ListDesign>;
using MFlat16 = Manager<FlatDesign<uint16_t>>;
using MFlat32 = Manager<FlatDesign<uint32_t>>;
using MRows16 = Manager<FlatRowsDesign<uint16_t>>;
using MRows32 = Manager<FlatRowsDesign<uint32_t>>;

template <class F>
int64_t visit(Handle* h, F&& f) {
    try {
        switch (h->kind) {
            case 0: return f(*static_cast<MDict*>(h->p));
            case 1: return f(*static_cast<MList*>(h->p));
            case 2: return f(*static_cast<MFlat16*>(h->p));
            case 3: return f(*static_cast<MFlat32*>(h->p));
            case 4: return f(*static_cast<MRows16*>(h->p));
            default: return f(*static_cast<MRows32*>(h->p));
        }
    } catch (const std::bad_alloc&) {
        return E_OOM;
    }
}

// The per-call functions of one kind, without visit()'s switch: what the native replay calls, by address
// (kvb_kind_function), once it knows the manager's kind.
template <class M>
struct Direct {
    static M& m(void* hp) { return *static_cast<M*>(static_cast<Handle*>(hp)->p); }
    template <class F>
    static int64_t guard(F&& f) {
        try {
            return f();
        } catch (const std::bad_alloc&) {
            return E_OOM;
        }
    }
    static int64_t can_allocate(void* hp, int64_t n) { return guard([&] { return m(hp).can_allocate(n); }); }
    static int64_t allocate(void* hp, int64_t seq, int64_t tokens) {
        return guard([&] { return m(hp).allocate(seq, tokens); });
    }
    static int64_t fork(void* hp, int64_t parent, int64_t child) {
        return guard([&] { return m(hp).fork(parent, child); });
    }
    static int64_t free(void* hp, int64_t seq) { return guard([&] { return m(hp).free(seq); }); }
    static int64_t decode_step(void* hp, const int32_t* ids, int64_t n, int64_t* cow, int64_t cow_cap,
                               int64_t* slots, int64_t slot_cap, int64_t* detail) {
        return guard([&] { return m(hp).decode_step(ids, n, cow, cow_cap, slots, slot_cap, detail); });
    }
    static int64_t lookup(void* hp, const int32_t* ids, int64_t n, int64_t* slots, int64_t slot_cap,
                          int64_t* detail) {
        return guard([&] { return m(hp).lookup(ids, n, slots, slot_cap, detail); });
    }
    static void* function(int64_t which) {
        void* fns[] = {reinterpret_cast<void*>(&can_allocate), reinterpret_cast<void*>(&allocate),
                       reinterpret_cast<void*>(&fork),         reinterpret_cast<void*>(&free),
                       reinterpret_cast<void*>(&decode_step),  reinterpret_cast<void*>(&lookup)};
        return fns[which];
    }
};

}  // namespace

KVB_API int64_t kvb_abi_version() { return 4; }

// The address of function which (0 can_allocate, 1 allocate, 2 fork, 3 free, 4 decode_step over int32 ids,
// 5 lookup over int32 ids; the signatures of kvb_can_allocate ... kvb_lookup_i32) for the kind of manager hp.
KVB_API void* kvb_kind_function(void* hp, int64_t which) {
    if (hp == nullptr || which < 0 || which > 5) return nullptr;
    switch (static_cast<Handle*>(hp)->kind) {
        case 0: return Direct<MDict>::function(which);
        case 1: return Direct<MList>::function(which);
        case 2: return Direct<MFlat16>::function(which);
        case 3: return Direct<MFlat32>::function(which);
        case 4: return Direct<MRows16>::function(which);
        default: return Direct<MRows32>::function(which);
    }
}

KVB_API void* kvb_create(int64_t kind, int64_t num_blocks, int64_t block_size, int64_t max_seqs, int64_t max_blocks) {
    if (num_blocks < 1 || num_blocks > INT32_MAX || block_size < 1 || (block_size & (block_size - 1)) != 0 ||
        block_size > (int64_t{1} << 30) ||
        max_seqs < 1 || max_seqs > INT32_MAX || max_blocks < 1 || max_blocks > INT32_MAX ||
        max_blocks * block_size > INT32_MAX)
        return nullptr;
    int64_t shift = 0;
    while ((int64_t{1} << shift) < block_size) ++shift;
    Config cfg{num_blocks, block_size, shift, max_seqs, max_blocks};
    Handle* h = nullptr;
    try {
        h = new Handle{0, nullptr};
        if (kind == KIND_DICT) {
            h->kind = 0, h->p = new MDict(cfg);
        } else if (kind == KIND_LIST) {
            h->kind = 1, h->p = new MList(cfg);
        } else if (kind == KIND_FLAT && num_blocks <= UINT16_LIMIT) {
            h->kind = 2, h->p = new MFlat16(cfg);
        } else if (kind == KIND_FLAT) {
            h->kind = 3, h->p = new MFlat32(cfg);
        } else if (kind == KIND_FLAT_ROWS && row_count(num_blocks, max_seqs, max_blocks) <= INT32_MAX) {
            if (num_blocks <= UINT16_LIMIT) {
                h->kind = 4, h->p = new MRows16(cfg);
            } else {
                h->kind = 5, h->p = new MRows32(cfg);
            }
        } else {
            delete h;
            return nullptr;
        }
    } catch (const std::bad_alloc&) {
        delete h;
        return nullptr;
    }
    return h;
}

KVB_API void kvb_destroy(void* hp) {
    Handle* h = static_cast<Handle*>(hp);
    if (h == nullptr) return;
    switch (h->kind) {
        case 0: delete static_cast<MDict*>(h->p); break;
        case 1: delete static_cast<MList*>(h->p); break;
        case 2: delete static_cast<MFlat16*>(h->p); break;
        case 3: delete static_cast<MFlat32*>(h->p); break;
        case 4: delete static_cast<MRows16*>(h->p); break;
        default: delete static_cast<MRows32*>(h->p); break;
    }
    delete h;
}

#define H static_cast<Handle*>(hp)

KVB_API int64_t kvb_can_allocate(void* hp, int64_t n) {
    return visit(H, [&](auto& m) { return m.can_allocate(n); });
}
KVB_API int64_t kvb_allocate(void* hp, int64_t seq, int64_t tokens) {
    return visit(H, [&](auto& m) { return m.allocate(seq, tokens); });
}
KVB_API int64_t kvb_append(void* hp, int64_t seq, int64_t* out2) {
    out2[0] = out2[1] = -1;
    return visit(H, [&](auto& m) { return m.append(seq, &out2[0], &out2[1]); });
}
KVB_API int64_t kvb_fork(void* hp, int64_t parent, int64_t child) {
    return visit(H, [&](auto& m) { return m.fork(parent, child); });
}
KVB_API int64_t kvb_free(void* hp, int64_t seq) {
    return visit(H, [&](auto& m) { return m.free(seq); });
}
KVB_API int64_t kvb_last_slot(void* hp, int64_t seq) {
    return visit(H, [&](auto& m) { return m.last_slot(seq); });
}
KVB_API int64_t kvb_decode_step(void* hp, const int64_t* ids, int64_t n, int64_t* cow, int64_t cow_cap, int64_t* slots,
                                int64_t slot_cap, int64_t* detail) {
    return visit(H, [&](auto& m) { return m.decode_step(ids, n, cow, cow_cap, slots, slot_cap, detail); });
}
KVB_API int64_t kvb_lookup(void* hp, const int64_t* ids, int64_t n, int64_t* slots, int64_t slot_cap, int64_t* detail) {
    return visit(H, [&](auto& m) { return m.lookup(ids, n, slots, slot_cap, detail); });
}
// The same two over int32 ids: a trace's rows as the harness's native replay keeps them.
KVB_API int64_t kvb_decode_step_i32(void* hp, const int32_t* ids, int64_t n, int64_t* cow, int64_t cow_cap,
                                    int64_t* slots, int64_t slot_cap, int64_t* detail) {
    return visit(H, [&](auto& m) { return m.decode_step(ids, n, cow, cow_cap, slots, slot_cap, detail); });
}
KVB_API int64_t kvb_lookup_i32(void* hp, const int32_t* ids, int64_t n, int64_t* slots, int64_t slot_cap,
                               int64_t* detail) {
    return visit(H, [&](auto& m) { return m.lookup(ids, n, slots, slot_cap, detail); });
}
KVB_API int64_t kvb_num_free(void* hp) {
    return visit(H, [&](auto& m) { return m.num_free(); });
}
KVB_API int64_t kvb_seq_len(void* hp, int64_t seq) {
    return visit(H, [&](auto& m) { return m.seq_len(seq); });
}
KVB_API int64_t kvb_block_table(void* hp, int64_t seq, int64_t* out, int64_t cap) {
    return visit(H, [&](auto& m) { return m.block_table(seq, out, cap); });
}
KVB_API int64_t kvb_ref_count(void* hp, int64_t block) {
    return visit(H, [&](auto& m) { return m.ref_count(block); });
}
KVB_API int64_t kvb_table_nbytes(void* hp, int64_t seq) {
    return visit(H, [&](auto& m) { return m.nbytes(seq); });
}
KVB_API int64_t kvb_id_bytes(void* hp) {
    return visit(H, [&](auto& m) { return m.id_bytes(); });
}
// Rows of flat-rows' pool held by some directory (0 for designs without a row pool).
KVB_API int64_t kvb_rows_in_use(void* hp) {
    return visit(H, [&](auto& m) { return m.rows_in_use(); });
}
// The rows kvb_create gives cpp-flat-rows' pool for this configuration (its memory, stated before it is built).
KVB_API int64_t kvb_row_count(int64_t num_blocks, int64_t max_seqs, int64_t max_blocks) {
    return row_count(num_blocks, max_seqs, max_blocks);
}

// Allocation calls made by the native containers so far (all managers of this library together).
KVB_API int64_t kvb_alloc_count() { return g_allocs; }
// Bytes those allocation calls asked for so far.
KVB_API int64_t kvb_alloc_bytes() { return g_alloc_bytes; }
