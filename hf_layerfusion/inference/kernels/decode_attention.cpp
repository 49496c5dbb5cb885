// Attention of a few query positions over cached keys/values: the attention of a decoding step (one query per row,
// or the beams of a sentence folded into query positions over the sentence's shared cross-attention keys). It is
// what `scaled_dot_product_attention` computes without a causal mask, with a boolean padding mask or none, and
// what the inference copies' attention interface (`hf_layerfusion.inference.decoding_attention`) runs at decoding
// steps. At these sizes (a few queries, tens of keys, 128 to 512 row-heads) SDPA's cost is mostly fixed per row-head
// (a small matrix product per block); here each row-head is a pass over its keys with 16-float vectors (8-float ones
// on AVX2 without AVX-512, where GCC kept 16-float vectors on the stack), and the exponentials are computed a vector at
// a time.
//
// Numbers: softmax(q k^T * scaling + mask) v in float32, the scores' dot products summed in 16 (or 8) lanes and then
// pairwise, exp(x) by range reduction and a degree-6 polynomial (Cephes' expf, about 1 ulp), rows whose keys are all
// masked give zeros (as SDPA does). Masked keys and their values are not read: they weigh exactly nothing, whatever
// they hold. It agrees with SDPA to float rounding (about 1e-6), not bit for bit.
//
// `key_rows` (beam search's self-attention cache, `_SelfAttentionCache.key_rows`): the row of the key/value buffers
// that holds each row's key at each position, instead of the row itself; a beam reorder then changes these indices
// instead of moving the rows' keys and values (which grow with the position: most of a beam step's copies).
// `buffer_rows` (the cross-attention keys/values once rows left the batch, `DecoderSteps.memory_rows`): the row of the
// keys, values and mask that each row reads, the same at every position; rows leaving the batch then change these
// indices instead of copying every cross-attention layer's keys and values into fewer rows.
#include "cpu_kernels.h"

#include <ATen/ops/empty.h>

#include "parallel.h"

#include <string>
#include <vector>

#include "vector16.h"

namespace {

constexpr int64_t kMaxHeadDim = 128;

struct Problem {
  const float *query, *key, *value;
  const bool* mask;  // true: attend; null: every key
  float* output;     // (rows, queries, heads, head_dim), contiguous
  const int64_t* key_rows;  // (rows, keys): the buffer row of each key; null: the row itself (or its buffer row)
  int64_t key_rows_stride;
  const int64_t* buffer_rows;  // (rows,): the row of key, value and mask of each row; null: the row itself
  int64_t rows, heads, queries, keys, head_dim;
  int64_t query_strides[3], key_strides[3], value_strides[3], mask_strides[2];  // rows, heads, positions
  float scaling;
};

// row-heads [begin, end) of `problem`, row-head = row * heads + head, with vectors V of head_dim / kChunks floats;
// `scores` holds keys rounded up to 16 floats
template <class V, int kChunks>
HLF_INLINE void attend_row_heads(const Problem& problem, int64_t begin, int64_t end, float* scores) {
  const Problem& p = problem;
  const int64_t padded_keys = (p.keys + kLanes - 1) / kLanes * kLanes;
  for (int64_t row_head = begin; row_head < end; ++row_head) {
    const int64_t row = row_head / p.heads, head = row_head % p.heads;
    const int64_t buffer_row = p.buffer_rows ? p.buffer_rows[row] : row;
    const float* keys = p.key + head * p.key_strides[1];
    const float* values = p.value + head * p.value_strides[1];
    const int64_t* key_rows = p.key_rows ? p.key_rows + row * p.key_rows_stride : nullptr;
    for (int64_t position = 0; position < p.queries; ++position) {
      const float* query = p.query + row * p.query_strides[0] + head * p.query_strides[1] + position * p.query_strides[2];
      const bool* mask = p.mask ? p.mask + buffer_row * p.mask_strides[0] + position * p.mask_strides[1] : nullptr;
      V scaled_query[kChunks];
      for (int c = 0; c < kChunks; ++c) scaled_query[c] = load_vector<V>(query + kWidth<V> * c) * p.scaling;
      // scores q . k (scaled), their maximum; masked keys are not read (in a padded batch, most of some rows' keys)
      float maximum = -INFINITY;
      for (int64_t k = 0; k < p.keys; ++k) {
        if (mask && !mask[k]) {
          scores[k] = -INFINITY;
          continue;
        }
        const float* key = keys + (key_rows ? key_rows[k] : buffer_row) * p.key_strides[0] + k * p.key_strides[2];
        V products = scaled_query[0] * load_vector<V>(key);
        for (int c = 1; c < kChunks; ++c) products += scaled_query[c] * load_vector<V>(key + kWidth<V> * c);
        const float score = lane_sum(products);
        scores[k] = score;
        maximum = score > maximum ? score : maximum;
      }
      float* out = p.output + ((row * p.queries + position) * p.heads + head) * p.head_dim;
      if (maximum == -INFINITY) {  // every key masked: zeros, as SDPA
        std::memset(out, 0, sizeof(float) * p.head_dim);
        continue;
      }
      // weights exp(score - maximum), a vector at a time (padding keys weigh 0), and their sum
      for (int64_t k = p.keys; k < padded_keys; ++k) scores[k] = -INFINITY;
      V sums{};
      for (int64_t k = 0; k < padded_keys; k += kWidth<V>) {
        const V weights = exp_nonpositive(load_vector<V>(scores + k) - maximum);
        store_vector(scores + k, weights);
        sums += weights;
      }
      const float inverse_sum = 1.f / lane_sum(sums);
      // the weighted sum of the values
      V accumulated[kChunks];
      for (int c = 0; c < kChunks; ++c) accumulated[c] = V{};
      for (int64_t k = 0; k < p.keys; ++k) {
        if (mask && !mask[k]) continue;
        const float weight = scores[k];
        const float* value = values + (key_rows ? key_rows[k] : buffer_row) * p.value_strides[0] + k * p.value_strides[2];
        for (int c = 0; c < kChunks; ++c) accumulated[c] += weight * load_vector<V>(value + kWidth<V> * c);
      }
      for (int c = 0; c < kChunks; ++c) store_vector(out + kWidth<V> * c, accumulated[c] * inverse_sum);
    }
  }
}

// the pass with head_dim / width(V) chunks, width(V) dividing head_dim
template <class V, int kChunks = 1>
HLF_INLINE void attend_with(const Problem& problem, int64_t begin, int64_t end, float* scores) {
  if constexpr (kChunks * kWidth<V> <= kMaxHeadDim) {
    if (problem.head_dim == kChunks * kWidth<V>)
      return attend_row_heads<V, kChunks>(problem, begin, end, scores);
    return attend_with<V, kChunks + 1>(problem, begin, end, scores);
  }
}

struct Attend {
  template <class V>
  HLF_INLINE static void run(const Problem* problem, int64_t begin, int64_t end, float* scores) {
    attend_with<V>(*problem, begin, end, scores);
  }
};

void check_layout(const at::Tensor& tensor, const char* name) {
  TORCH_CHECK(tensor.dim() == 4 && tensor.scalar_type() == at::kFloat && tensor.device().is_cpu(),
              "decode_attention: ", name, " must be a 4-D float32 CPU tensor, got ", tensor.dim(), "-D ",
              tensor.scalar_type(), " on ", tensor.device());
  TORCH_CHECK(tensor.stride(3) == 1, "decode_attention: ", name, "'s last dimension must be contiguous");
}

}  // namespace

// query (rows, heads, queries, head_dim), key/value (rows, heads, keys, head_dim), any strides with a contiguous last
// dimension; mask: None or bool (rows or 1, 1, queries or 1, keys), true = attend; key_rows: None or int64 (rows, keys),
// each a row of key/value, which may then have more rows; buffer_rows (not with key_rows): None or int64 (rows,), the
// row of key, value and mask (then of as many rows as key, or 1) of each row -> (rows, queries, heads, head_dim)
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               const c10::optional<at::Tensor>& mask, double scaling,
                               const c10::optional<at::Tensor>& key_rows,
                               const c10::optional<at::Tensor>& buffer_rows) {
  check_layout(query, "query");
  check_layout(key, "key");
  check_layout(value, "value");
  const int64_t rows = query.size(0), heads = query.size(1), queries = query.size(2), head_dim = query.size(3);
  const int64_t keys = key.size(2);
  TORCH_CHECK(head_dim % kLanes == 0 && head_dim <= kMaxHeadDim,
              "decode_attention: head_dim must be a multiple of 16 up to 128, got ", head_dim);
  TORCH_CHECK(!(key_rows.has_value() && buffer_rows.has_value()),
              "decode_attention: give key_rows or buffer_rows, not both");
  // through key_rows or buffer_rows, rows read buffer rows: at least as many with key_rows (beams that left the batch
  // leave theirs behind), any number with buffer_rows (checked with its indices below)
  const bool indirect = key_rows.has_value() || buffer_rows.has_value();
  const bool buffer_rows_fit = key_rows.has_value() ? key.size(0) >= rows : buffer_rows.has_value() || key.size(0) == rows;
  TORCH_CHECK(key.sizes() == value.sizes() && buffer_rows_fit && key.size(1) == heads && key.size(3) == head_dim,
              "decode_attention: key ", key.sizes(), " and value ", value.sizes(), " must be (",
              buffer_rows.has_value() ? "buffer rows" : std::to_string(rows) + (indirect ? " or more" : ""), ", ",
              heads, ", keys, ", head_dim, ")");
  TORCH_CHECK(keys > 0, "decode_attention: no keys");
  Problem problem{query.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(), nullptr, nullptr,
                  nullptr, 0, nullptr, rows, heads, queries, keys, head_dim,
                  {query.stride(0), query.stride(1), query.stride(2)},
                  {key.stride(0), key.stride(1), key.stride(2)},
                  {value.stride(0), value.stride(1), value.stride(2)},
                  {0, 0}, static_cast<float>(scaling)};
  if (mask.has_value()) {
    const auto& m = *mask;
    const int64_t mask_rows = buffer_rows.has_value() ? key.size(0) : rows;  // buffer_rows index the mask's rows too
    TORCH_CHECK(m.dim() == 4 && m.scalar_type() == at::kBool && (m.size(0) == 1 || m.size(0) == mask_rows) &&
                    m.size(1) == 1 && (m.size(2) == 1 || m.size(2) == queries) && m.size(3) == keys &&
                    m.stride(3) == 1,
                "decode_attention: the mask must be bool (", mask_rows, " or 1, 1, ", queries, " or 1, ", keys,
                ") with contiguous keys, got ", m.scalar_type(), " ", m.sizes());
    problem.mask = m.data_ptr<bool>();
    problem.mask_strides[0] = m.size(0) == 1 ? 0 : m.stride(0);
    problem.mask_strides[1] = m.size(2) == 1 ? 0 : m.stride(2);
  }
  if (key_rows.has_value()) {
    const auto& r = *key_rows;
    TORCH_CHECK(r.dim() == 2 && r.scalar_type() == at::kLong && r.device().is_cpu() && r.size(0) == rows &&
                    r.size(1) == keys && r.stride(1) == 1,
                "decode_attention: key_rows must be int64 (", rows, ", ", keys, ") with contiguous keys, got ",
                r.scalar_type(), " ", r.sizes());
    const int64_t* indices = r.data_ptr<int64_t>();
    for (int64_t row = 0; row < rows; ++row)  // a row outside the buffers would be read out of bounds
      for (int64_t k = 0; k < keys; ++k) {
        const int64_t index = indices[row * r.stride(0) + k];
        TORCH_CHECK(index >= 0 && index < key.size(0), "decode_attention: key_rows[", row, ", ", k, "] = ", index,
                    " is outside the ", key.size(0), " rows of the keys");
      }
    problem.key_rows = indices;
    problem.key_rows_stride = r.stride(0);
  }
  if (buffer_rows.has_value()) {
    const auto& r = *buffer_rows;
    TORCH_CHECK(r.dim() == 1 && r.scalar_type() == at::kLong && r.device().is_cpu() && r.size(0) == rows &&
                    r.stride(0) == 1,
                "decode_attention: buffer_rows must be contiguous int64 (", rows, ",), got ", r.scalar_type(), " ",
                r.sizes());
    const int64_t* indices = r.data_ptr<int64_t>();
    for (int64_t row = 0; row < rows; ++row)  // a row outside the buffers would be read out of bounds
      TORCH_CHECK(indices[row] >= 0 && indices[row] < key.size(0), "decode_attention: buffer_rows[", row, "] = ",
                  indices[row], " is outside the ", key.size(0), " rows of the keys");
    problem.buffer_rows = indices;
  }
  auto output = at::empty({rows, queries, heads, head_dim}, query.options());
  problem.output = output.data_ptr<float>();
  const int64_t padded_keys = (keys + kLanes - 1) / kLanes * kLanes;
  hlf::parallel_for(0, rows * heads, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(padded_keys);
    run_with_widest_vectors<Attend>(&problem, begin, end, scores.data());
  });
  return output;
}
