// The Python module of the CPU kernels (`hf_layerfusion.inference.cpu_kernels.compiled_kernels`).
#include "cpu_kernels.h"
#include "parallel.h"

#include <ATen/Parallel.h>
// pybind11 and its casters for ATen tensors (what <torch/python.h> adds to it is the C++ frontend, ~10 s more to
// compile)
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

// int8 weights without their packed copy: its layout is this CPU's product's (AMX, VNNI or AVX2) and this version's,
// so a state read on another CPU or by another version would multiply with the wrong layout; they are packed again,
// for the fastest product there
pybind11::tuple KernelLinear::state() const {
  if (code_bits_ == 0) return pybind11::make_tuple("float32", weights_, out_features_, bias_, relu_);
  return pybind11::make_tuple("int8", weights_, column_sums_, weight_scale_, bias_, relu_, code_bits_);
}

KernelLinear KernelLinear::from_state(const pybind11::tuple& state) {
  const auto kind = state[0].cast<std::string>();
  const auto bias = [&](size_t index) { return state[index].cast<c10::optional<at::Tensor>>(); };
  if (kind == "float32" && state.size() == 5) {
    return float32(state[1].cast<at::Tensor>(), state[2].cast<int64_t>(), bias(3), state[4].cast<bool>());
  }
  TORCH_CHECK(kind == "int8" && state.size() == 7, "KernelLinear: not a KernelLinear's state (", kind, ", ",
              state.size(), " entries)");
  const auto weight_t = state[1].cast<at::Tensor>();
  const auto code_bits = state[6].cast<int64_t>();
  return int8(weight_t, pack_int8_weights(weight_t, code_bits), state[2].cast<at::Tensor>(),
              state[3].cast<at::Tensor>(), bias(4), state[5].cast<bool>(), code_bits);
}

namespace {
std::atomic<int64_t> instruction_set_cap{kAmxInstructions};
}  // namespace

int64_t max_instruction_set() { return instruction_set_cap.load(std::memory_order_relaxed); }

void set_max_instruction_set(int64_t set) {
  TORCH_CHECK(set >= kGenericInstructions && set <= kAmxInstructions, "set_max_instruction_set: the cap is ",
              kGenericInstructions, " (generic) to ", kAmxInstructions, " (amx, no cap), got ", set);
  instruction_set_cap.store(set, std::memory_order_relaxed);
}

// How many threads `hlf::parallel_for` (parallel.h) spreads `rounds` rounds of `tasks` one-item tasks over, each round
// waiting for the last, as a decoding step's kernel calls do; each chunk takes `chunk_microseconds` (asleep: time for
// the other threads to claim theirs, where the caller claims what no thread has yet); `failing_task` >= 0: that task
// throws instead (an error on any thread reaches the caller)
int64_t parallel_for_threads(int64_t tasks, int64_t rounds, int64_t failing_task, int64_t chunk_microseconds) {
  TORCH_CHECK(tasks > 0 && rounds > 0, "parallel_for_threads: tasks and rounds must be positive, got ", tasks, " and ",
              rounds);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  for (int64_t round = 0; round < rounds; ++round) {
    hlf::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        TORCH_CHECK(task != failing_task, "parallel_for_threads: task ", task, " failed, as asked");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(chunk_microseconds));
      const std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    });
  }
  return static_cast<int64_t>(threads.size());
}

std::string parallel_backend() {
  return hlf::parallel_backend().load() == hlf::ParallelBackend::openmp ? "openmp" : "pool";
}

void set_parallel_backend(const std::string& backend) {
  TORCH_CHECK(backend == "pool" || backend == "openmp", "set_parallel_backend: the backend is \"pool\" or ",
              "\"openmp\", got \"", backend, "\"");
  hlf::parallel_backend().store(backend == "openmp" ? hlf::ParallelBackend::openmp : hlf::ParallelBackend::pool);
}

void set_kernel_threads(int64_t threads) {
  TORCH_CHECK(threads >= 0 && threads <= 1024, "set_kernel_threads: threads is 0 (torch's count) to 1024, got ",
              threads);
  hlf::kernel_threads_setting = static_cast<int>(threads);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels that compute release the GIL, as torch's own operators do: batches translated side by side in Python
  // threads (`translate(..., inter_threads=N)`) run their kernels at the same time
  const auto without_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("parallel_for_threads", &parallel_for_threads,
        "How many threads the kernels' parallel_for uses for `tasks` tasks, over `rounds` rounds; `failing_task` >= 0 "
        "throws in that task.",
        pybind11::arg("tasks"), pybind11::arg("rounds") = 1, pybind11::arg("failing_task") = -1,
        pybind11::arg("chunk_microseconds") = 500, without_gil);
  m.def("parallel_backend", &parallel_backend,
        "The threads the kernels split their work across besides the caller: \"pool\" (the package's, the default) "
        "or \"openmp\" (torch's, the default where OMP_WAIT_POLICY=ACTIVE).");
  m.def("set_parallel_backend", &set_parallel_backend, "Set `parallel_backend()` (\"pool\" or \"openmp\").",
        pybind11::arg("backend"));
  m.def("kernel_threads", &hlf::kernel_threads,
        "How many threads this thread's kernel calls use on the pool backend (set_kernel_threads, else torch's).");
  m.def("set_kernel_threads", &set_kernel_threads,
        "This thread's kernel calls use `threads` threads on the pool backend (0: torch's count, the default).",
        pybind11::arg("threads"));
  m.def("max_instruction_set", &max_instruction_set,
        "The widest instruction set the kernels may use: 0 generic, 1 AVX2, 2 AVX-512, 3 AMX (no cap).");
  m.def("set_max_instruction_set", &set_max_instruction_set,
        "Caps the kernels' instruction set (0 generic, 1 AVX2, 2 AVX-512, 3 AMX: no cap); copies made before keep "
        "their packed int8 weights, refused by a lower cap.",
        pybind11::arg("instruction_set"));
  m.def("amx_available", &amx_available, "Whether this CPU and process can use AMX int8 tiles.");
  m.def("int8_product", &int8_product,
        "What sums int8_linear's products of code_bits codes on this CPU: AMX, oneDNN, AVX-512 VNNI, AVX2 or float32 "
        "blocks.",
        pybind11::arg("code_bits"));
  m.def("int8_products", &int8_products,
        "The products that run code_bits weights on this CPU, its fastest first: amx, onednn, vnni, avx2, "
        "float32_blocks.",
        pybind11::arg("code_bits"));
  m.def("onednn_vnni_timings", &onednn_vnni_timings,
        "Microseconds per row of the one-thread products this process timed to order 'onednn' and 'vnni' in "
        "int8_products, summed over 32 and 128 rows of 512 -> 2048 (measured at the first call; empty where the CPU "
        "has no AVX-512 VNNI).");
  m.def("int8_code_bits", &int8_code_bits,
        "The int8 format this CPU's fastest product takes: 8 bits (AMX, AVX-512 VNNI, or no AVX2), 7 bits (AVX2's "
        "vpmaddubsw).");
  m.def("pack_int8_weights", &pack_int8_weights,
        "int8 weights (in, out) in the layout of a product (AMX tiles, VNNI panels for VNNI and oneDNN, AVX2 "
        "panels; by default this CPU's fastest); empty for the float32 blocks.",
        pybind11::arg("weight_t"), pybind11::arg("code_bits"), pybind11::arg("product") = "");
  m.def("int8_linear", &int8_linear, without_gil,
        "Per-row asymmetric quantization to code_bits codes, exact int32 product, float dequantization + bias (and ReLU).",
        pybind11::arg("x"), pybind11::arg("weight_t"), pybind11::arg("packed_weights"), pybind11::arg("column_sums"),
        pybind11::arg("weight_scale"), pybind11::arg("bias"), pybind11::arg("relu"), pybind11::arg("code_bits"),
        pybind11::arg("amx_minimum_rows") = kAmxMinimumRows, pybind11::arg("product") = "",
        pybind11::arg("onednn_minimum_rows") = kOneDnnMinimumRows, pybind11::arg("out") = pybind11::none());
  m.attr("AMX_MINIMUM_ROWS") = kAmxMinimumRows;
  m.attr("ONEDNN_MINIMUM_ROWS") = kOneDnnMinimumRows;
  m.def("float32_linear_available", &float32_linear_available, "Whether this CPU runs float32_linear (AVX-512, or AVX2 with FMA).");
  m.def("float32_linear", &float32_linear, without_gil, "x W^T + b (and ReLU) with W packed into panels of 16 output features.",
        pybind11::arg("x"), pybind11::arg("panels"), pybind11::arg("out_features"), pybind11::arg("bias"),
        pybind11::arg("relu") = false, pybind11::arg("out") = pybind11::none());
  m.def("decode_attention", &decode_attention, without_gil, "Attention of a few query positions over cached keys/values.",
        pybind11::arg("query"), pybind11::arg("key"), pybind11::arg("value"), pybind11::arg("mask"),
        pybind11::arg("scaling"), pybind11::arg("key_rows") = pybind11::none(),
        pybind11::arg("buffer_rows") = pybind11::none());
  m.def("mixture_log_probs", &mixture_log_probs, without_gil, "GTrans' log sum_g psi_g softmax(z_g), clamped at FLT_MIN (Eq. 5).",
        pybind11::arg("group_logits"), pybind11::arg("psi"));
  m.def("add_layer_norm", &add_layer_norm, without_gil, "LayerNorm(x + y), or LayerNorm(x) without y, in one call.",
        pybind11::arg("x"), pybind11::arg("y"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"));
  // pybind11 registers a C++ class once per process, but torch's `load` imports this module anew when called again
  // (after `compiled_kernels.cache_clear()`): a later import binds the class registered by the first
  if (const auto registered = pybind11::detail::get_type_handle(typeid(KernelLinear), false)) {
    m.attr("KernelLinear") = registered;
  } else {
    pybind11::class_<KernelLinear>(m, "KernelLinear",
                                   "A linear layer as the kernels run it, made once: float32 panels or int8 weights, the "
                                   "bias, an optional ReLU; called with its input only.")
        .def_static("float32", &KernelLinear::float32, "float32_linear's weights.", pybind11::arg("panels"),
                    pybind11::arg("out_features"), pybind11::arg("bias"), pybind11::arg("relu"))
        .def_static("int8", &KernelLinear::int8, "int8_linear's weights.", pybind11::arg("weight_t"),
                    pybind11::arg("packed_weights"), pybind11::arg("column_sums"), pybind11::arg("weight_scale"),
                    pybind11::arg("bias"), pybind11::arg("relu"), pybind11::arg("code_bits"),
                    pybind11::arg("product") = "")
        .def_static("concatenate", &KernelLinear::concatenate,
                    "One layer computing these layers' outputs side by side, each exactly as its own layer.",
                    pybind11::arg("linears"))
        .def("__call__", &KernelLinear::operator(), without_gil, "The layer's output for x, written into `out` where given.",
             pybind11::arg("x"), pybind11::arg("out") = pybind11::none())
        .def_property_readonly("out_features", &KernelLinear::out_features)
        .def_property_readonly("relu", &KernelLinear::relu)
        .def_property_readonly("code_bits", &KernelLinear::code_bits, "8 or 7 for int8 weights, 0 for float32 ones.")
        .def_property_readonly("product", &KernelLinear::product,
                               "int8: the product its packed weights are laid out for (float32_blocks: none).")
        .def(pybind11::pickle([](const KernelLinear& linear) { return linear.state(); },
                              [](const pybind11::tuple& state) { return KernelLinear::from_state(state); }));
  }
  m.def("self_attention_step", &self_attention_step, without_gil,
        "A decoding step of a residual self-attention sub-layer (KernelLinear projections, cache write at `position`).");
  m.def("cross_attention_step", &cross_attention_step, without_gil,
        "A decoding step of a residual cross-attention sub-layer over precomputed keys/values.", pybind11::arg("h"),
        pybind11::arg("norm_weight"), pybind11::arg("norm_bias"), pybind11::arg("eps"),
        pybind11::arg("normalize_before"), pybind11::arg("q_proj"), pybind11::arg("out_proj"), pybind11::arg("keys"),
        pybind11::arg("values"), pybind11::arg("mask"), pybind11::arg("scaling"),
        pybind11::arg("memory_rows") = pybind11::none());
  m.def("feed_forward_step", &feed_forward_step, without_gil, "A decoding step of a residual ReLU feed-forward sub-layer.");
  if (const auto registered = pybind11::detail::get_type_handle(typeid(DecoderLayerSteps), false)) {
    m.attr("DecoderLayerSteps") = registered;  // as KernelLinear above
  } else {
    pybind11::class_<DecoderLayerSteps>(m, "DecoderLayerSteps",
                                        "The decoder's layers at one decoding step in one call: sub-layer steps added "
                                        "in the stack's order, end_layer after each layer's last.")
        .def(pybind11::init<>())
        .def("add_self_attention", &DecoderLayerSteps::add_self_attention, pybind11::arg("norm_weight"),
             pybind11::arg("norm_bias"), pybind11::arg("eps"), pybind11::arg("normalize_before"),
             pybind11::arg("qkv_proj"), pybind11::arg("out_proj"), pybind11::arg("slot"), pybind11::arg("scaling"))
        .def("add_cross_attention", &DecoderLayerSteps::add_cross_attention, pybind11::arg("norm_weight"),
             pybind11::arg("norm_bias"), pybind11::arg("eps"), pybind11::arg("normalize_before"),
             pybind11::arg("q_proj"), pybind11::arg("out_proj"), pybind11::arg("slot"), pybind11::arg("scaling"))
        .def("add_feed_forward", &DecoderLayerSteps::add_feed_forward, pybind11::arg("norm_weight"),
             pybind11::arg("norm_bias"), pybind11::arg("eps"), pybind11::arg("normalize_before"), pybind11::arg("fc1"),
             pybind11::arg("fc2"))
        .def("end_layer", &DecoderLayerSteps::end_layer)
        .def("__call__", &DecoderLayerSteps::operator(), without_gil, pybind11::arg("h"), pybind11::arg("keys"),
             pybind11::arg("values"), pybind11::arg("lengths"), pybind11::arg("prefixes"), pybind11::arg("cross_keys"),
             pybind11::arg("cross_values"), pybind11::arg("memory_mask"), pybind11::arg("key_rows") = pybind11::none(),
             pybind11::arg("memory_rows") = pybind11::none())
        .def_property_readonly("layers", &DecoderLayerSteps::layers);
  }
  m.def("first_argmax", &first_argmax, without_gil, "Each row's first index of its largest score (of its first NaN if any).",
        pybind11::arg("scores"));
  m.def("greedy_choice", &greedy_choice, without_gil,
        "A greedy step's tokens (first_argmax; padding for finished rows), written into the sequences, and the "
        "finished rows updated: (tokens, finished count).",
        pybind11::arg("scores"), pybind11::arg("finished"), pybind11::arg("sequences"), pybind11::arg("rows"),
        pybind11::arg("position"), pybind11::arg("pad_token"), pybind11::arg("eos_tokens"));
  m.def("beam_top_k", &beam_top_k, without_gil,
        "Each item's k best candidates log_probs[beam, token] + beam_scores[beam], as torch.topk over its "
        "beams * vocab candidates (ties: lowest index first).",
        pybind11::arg("log_probs"), pybind11::arg("beam_scores"), pybind11::arg("k"));
  m.def("beam_top_k_continuations", &beam_top_k_continuations, without_gil,
        "transformers' _get_top_k_continuations (no sampling) of beam_top_k's candidates: their scores, their beams' "
        "sequences with the token at cur_len, their beams' indices with item * beams + beam at beam_index_column.",
        pybind11::arg("log_probs"), pybind11::arg("beam_scores"), pybind11::arg("k"),
        pybind11::arg("running_sequences"), pybind11::arg("running_beam_indices"), pybind11::arg("cur_len"),
        pybind11::arg("beam_index_column"));
  m.def("beam_finish_step", &beam_finish_step, without_gil,
        "The rest of a beam-search step after beam_top_k_continuations, in place: the running beams "
        "(_get_running_beams_for_next_iteration), the finished ones (_update_finished_beams), the early-stop "
        "heuristic; returns (each running row's source row, the items that can no longer change, whether the search "
        "goes on).",
        pybind11::arg("topk_log_probs"), pybind11::arg("topk_sequences"), pybind11::arg("topk_beam_indices"),
        pybind11::arg("running_sequences"), pybind11::arg("running_beam_scores"),
        pybind11::arg("running_beam_indices"), pybind11::arg("sequences"), pybind11::arg("beam_scores"),
        pybind11::arg("beam_indices"), pybind11::arg("is_sent_finished"), pybind11::arg("improvable"),
        pybind11::arg("eos_tokens"), pybind11::arg("cur_len"), pybind11::arg("decoder_prompt_len"),
        pybind11::arg("max_length"), pybind11::arg("length_penalty"), pybind11::arg("early_stopping"));
  m.def("move_rows", &move_rows, without_gil,
        "Row targets[i] of every buffer takes row sources[i]'s contents (all read before any is written), in place.",
        pybind11::arg("buffers"), pybind11::arg("targets"), pybind11::arg("sources"));
}
