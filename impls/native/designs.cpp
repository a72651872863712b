// The three BlockManager designs in C++, behind the contract of impls/contract.py, one foreign call per operation.
//
//   kind 0  cpp-dict  design A: std::unordered_map per sequence (logical -> physical), ref counts in an
//                     unordered_map holding only blocks in use, the free pool a std::vector used as a stack;
//   kind 1  cpp-list  design B: std::vector per sequence grown by push_back (the standard growth policy), ref
//                     counts a vector indexed by block id, the free pool a vector used as a stack;
//   kind 2  cpp-flat  design C: one preallocated [max_seqs * max_blocks_per_seq] table of uint16 ids (uint32
//                     above 65,536 blocks), ref counts and a free-block stack in preallocated int32 arrays.
//
// Validation (argument ranges, sequence state, capacity, pool; in the contract's order and before any change)
// and the batched decode step's whole-step validation and worst-case reservation are written once, in
// Manager<D>, so the designs differ only in their data structures, as the Python designs do.
//
// Every container allocates through CountingAllocator, which counts allocation calls in g_allocs. The extern
// "C" functions never let an exception escape (E_OOM instead) and never write past a buffer whose capacity
// they were given. The status codes (kvb::OK, kvb::E_*) come from impls/contract.py, in a prelude the build
// puts before this file (impls/native/toolchain.py). Timed replays are the harness's (harness/measure/
// native_replay.cpp): it calls the kvb_* functions below through their addresses, one call per operation.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#define KVB_API extern "C" __attribute__((visibility("default")))

namespace {

using namespace kvb;  // the contract's codes (the generated prelude)

int64_t g_allocs = 0;  // allocation calls made by the containers (single-threaded use)

template <class T>
struct CountingAllocator {
    using value_type = T;
    CountingAllocator() noexcept = default;
    template <class U>
    CountingAllocator(const CountingAllocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
        ++g_allocs;
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t) noexcept { ::operator delete(p); }
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
struct Common {
    Config c;
    Vec<int32_t> lens;
    Vec<int32_t> marks;  // duplicate detection in a decode step without allocating
    int32_t stamp = 0;

    explicit Common(const Config& cfg) : c(cfg), lens(cfg.max_seqs, 0), marks(cfg.max_seqs, 0) {}

    int64_t blocks_for(int64_t tokens) const { return (tokens + c.block_size - 1) >> c.shift; }
    int64_t slot_of(int64_t block, int64_t pos) const { return (block << c.shift) | (pos & (c.block_size - 1)); }
    bool in_range(int64_t seq) const { return seq >= 0 && seq < c.max_seqs; }

    int64_t check_active(int64_t seq) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        return lens[seq] == 0 ? E_INACTIVE : OK;
    }
    int64_t check_allocate(int64_t seq, int64_t tokens) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        if (tokens < 1) return E_TOKENS;
        if (tokens > c.max_blocks * c.block_size) return E_TOO_LONG;  // blocks_for(tokens) > max_blocks
        return lens[seq] != 0 ? E_ACTIVE : OK;
    }
    int64_t check_append(int64_t seq) const {
        if (!in_range(seq)) return E_SEQ_RANGE;
        int64_t n = lens[seq];
        if (n == 0) return E_INACTIVE;
        if ((n & (c.block_size - 1)) == 0 && (n >> c.shift) >= c.max_blocks) return E_TOO_LONG;
        return OK;
    }
    int64_t check_fork(int64_t parent, int64_t child) const {
        if (!in_range(parent) || !in_range(child)) return E_SEQ_RANGE;
        if (lens[parent] == 0) return E_INACTIVE;
        return lens[child] != 0 ? E_ACTIVE : OK;
    }
    int32_t next_stamp() {
        if (stamp == INT32_MAX) {
            std::fill(marks.begin(), marks.end(), 0);
            stamp = 0;
        }
        return ++stamp;
    }
};

// ---- design A: a hash map per sequence -------------------------------------------------------------------
struct DictDesign : Common {
    using Table = Map<int32_t, int32_t>;
    Map<int32_t, Table> tables;  // row -> (logical -> physical); a new map per allocate, erased on free
    Map<int32_t, int32_t> refs;  // only blocks in use
    Vec<int32_t> free_list;      // a stack: back() is handed out next

    explicit DictDesign(const Config& cfg) : Common(cfg) {
        free_list.reserve(cfg.num_blocks);
        for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_list.push_back(static_cast<int32_t>(b));
    }
    int64_t num_free() const { return static_cast<int64_t>(free_list.size()); }
    int32_t take() {
        int32_t b = free_list.back();
        free_list.pop_back();
        refs[b] = 1;
        return b;
    }
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
        int64_t n = lens[seq];
        lens[seq] = static_cast<int32_t>(n + 1);
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
struct ListDesign : Common {
    using Table = Vec<int32_t>;
    std::vector<Table, CountingAllocator<Table>> tables;  // per row; empty (no storage) when inactive
    Vec<int32_t> refs;
    Vec<int32_t> free_list;

    explicit ListDesign(const Config& cfg) : Common(cfg), tables(cfg.max_seqs), refs(cfg.num_blocks, 0) {
        free_list.reserve(cfg.num_blocks);
        for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_list.push_back(static_cast<int32_t>(b));
    }
    int64_t num_free() const { return static_cast<int64_t>(free_list.size()); }
    int32_t take() {
        int32_t b = free_list.back();
        free_list.pop_back();
        refs[b] = 1;
        return b;
    }
    void take_table(int64_t seq, int64_t need) {
        Table t;
        t.reserve(need);  // the prompt's blocks in one allocation; decode appends grow it by push_back
        for (int64_t j = 0; j < need; ++j) t.push_back(take());
        tables[seq] = std::move(t);
    }
    bool last_shared(int64_t seq) { return refs[tables[seq].back()] > 1; }
    int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t n = lens[seq];
        lens[seq] = static_cast<int32_t>(n + 1);
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

// ---- design C: a flat preallocated table and a free-block stack ------------------------------------------
template <class Id>
struct FlatDesign : Common {
    Vec<Id> table;  // [max_seqs * max_blocks], row-major
    Vec<int32_t> refs;
    Vec<int32_t> stack;
    int64_t top;

    explicit FlatDesign(const Config& cfg)
        : Common(cfg), table(cfg.max_seqs * cfg.max_blocks, 0), refs(cfg.num_blocks, 0), stack(cfg.num_blocks),
          top(cfg.num_blocks) {
        for (int64_t i = 0; i < cfg.num_blocks; ++i) stack[i] = static_cast<int32_t>(cfg.num_blocks - 1 - i);
    }
    Id* row(int64_t seq) { return table.data() + seq * c.max_blocks; }
    int64_t num_free() const { return top; }
    int32_t take() {
        int32_t b = stack[--top];
        refs[b] = 1;
        return b;
    }
    void take_table(int64_t seq, int64_t need) {
        Id* r = row(seq);
        for (int64_t j = 0; j < need; ++j) r[j] = static_cast<Id>(take());
    }
    bool last_shared(int64_t seq) { return refs[row(seq)[(lens[seq] - 1) >> c.shift]] > 1; }
    int64_t append_unchecked(int64_t seq, int64_t* src_out, int64_t* dst_out) {
        int64_t n = lens[seq];
        lens[seq] = static_cast<int32_t>(n + 1);
        Id* r = row(seq);
        int64_t j = n >> c.shift;
        if ((n & (c.block_size - 1)) == 0) {
            r[j] = static_cast<Id>(take());
            return 0;
        }
        int32_t src = r[j];
        if (refs[src] == 1) return 0;
        refs[src] -= 1;
        int32_t dst = take();
        r[j] = static_cast<Id>(dst);
        *src_out = src;
        *dst_out = dst;
        return 1;
    }
    void fork_table(int64_t parent, int64_t child) {
        const Id* p = row(parent);
        Id* ch = row(child);
        for (int64_t j = 0, n = blocks_for(lens[parent]); j < n; ++j) {
            ch[j] = p[j];
            refs[p[j]] += 1;
        }
    }
    void free_table(int64_t seq) {
        const Id* r = row(seq);
        for (int64_t j = blocks_for(lens[seq]) - 1; j >= 0; --j) {
            if (--refs[r[j]] == 0) stack[top++] = r[j];
        }
    }
    int64_t block_at(int64_t seq, int64_t j) { return row(seq)[j]; }
    int64_t ref(int64_t b) const { return refs[b]; }
    int64_t table_nbytes(int64_t) { return static_cast<int64_t>(sizeof(Id)) * c.max_blocks; }  // one row
    int64_t id_bytes() const { return sizeof(Id); }
};

// ---- the contract, once for every design -----------------------------------------------------------------
template <class D>
struct Manager : D {
    explicit Manager(const Config& cfg) : D(cfg) {}

    bool needs_block(int64_t seq) { return (this->lens[seq] & (this->c.block_size - 1)) == 0 || this->last_shared(seq); }

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
        this->lens[seq] = static_cast<int32_t>(tokens);
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
        this->lens[child] = this->lens[parent];
        return OK;
    }
    int64_t free(int64_t seq) {
        int64_t rc = this->check_active(seq);
        if (rc != OK) return rc;
        this->free_table(seq);
        this->lens[seq] = 0;
        return OK;
    }
    int64_t last_slot_unchecked(int64_t seq) {
        int64_t m = this->lens[seq] - 1;
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
        int32_t mark = this->next_stamp();
        for (int64_t i = 0; i < n; ++i) {  // the whole step first, before changing anything
            int64_t seq = ids[i];
            int64_t rc = this->check_append(seq);
            if (rc == OK && this->marks[seq] == mark) rc = E_DUPLICATE;
            if (rc != OK) {
                *detail = i;
                return rc;
            }
            this->marks[seq] = mark;
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
    int64_t seq_len(int64_t seq) const { return this->in_range(seq) ? this->lens[seq] : E_SEQ_RANGE; }
    int64_t block_table(int64_t seq, int64_t* out, int64_t cap) {
        int64_t rc = this->check_active(seq);
        if (rc != OK) return rc;
        int64_t n = this->blocks_for(this->lens[seq]);
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
enum : int { KIND_DICT = 0, KIND_LIST = 1, KIND_FLAT = 2 };

struct Handle {
    int kind;  // 0 dict, 1 list, 2 flat uint16, 3 flat uint32
    void* p;
};

using MDict = Manager<DictDesign>;
using MList = Manager<ListDesign>;
using MFlat16 = Manager<FlatDesign<uint16_t>>;
using MFlat32 = Manager<FlatDesign<uint32_t>>;

template <class F>
int64_t visit(Handle* h, F&& f) {
    try {
        switch (h->kind) {
            case 0: return f(*static_cast<MDict*>(h->p));
            case 1: return f(*static_cast<MList*>(h->p));
            case 2: return f(*static_cast<MFlat16*>(h->p));
            default: return f(*static_cast<MFlat32*>(h->p));
        }
    } catch (const std::bad_alloc&) {
        return E_OOM;
    }
}

}  // namespace

KVB_API int64_t kvb_abi_version() { return 2; }

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
        } else if (kind == KIND_FLAT && num_blocks <= 65536) {
            h->kind = 2, h->p = new MFlat16(cfg);
        } else if (kind == KIND_FLAT) {
            h->kind = 3, h->p = new MFlat32(cfg);
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
        default: delete static_cast<MFlat32*>(h->p); break;
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

// Allocation calls made by the native containers so far (all managers of this library together).
KVB_API int64_t kvb_alloc_count() { return g_allocs; }
