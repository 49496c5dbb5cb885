// The widest x86 instructions the kernels may use: what the CPU has, capped by `set_max_instruction_set` (from Python:
// `cpu_kernels.limit_instruction_set`, or the environment variable HF_LAYERFUSION_MAX_CPU_ISA when the module loads),
// so that one machine can run, test and time the code paths that narrower CPUs take, as CTranslate2's
// CT2_FORCE_CPU_ISA and oneDNN's ONEDNN_MAX_CPU_ISA do for theirs. Each kernel still checks that the CPU has what it
// runs; the cap only ever removes instructions.
#pragma once

#include <cstdint>

// in the order of width; the names are cpu_kernels.py's INSTRUCTION_SETS
enum InstructionSet : int64_t {
  kGenericInstructions = 0,  // no x86 vector extension chosen at run time (what the compiler targets by default)
  kAvx2Instructions = 1,     // AVX2 (the float kernels: with FMA)
  kAvx512Instructions = 2,   // AVX-512 (the int8 product: with VNNI and BW where the CPU has them)
  kAmxInstructions = 3,      // AMX tiles: every instruction set the kernels have code for (no cap)
};

int64_t max_instruction_set();              // the cap, kAmxInstructions unless lowered
void set_max_instruction_set(int64_t set);  // refuses a value outside the enum
inline bool instruction_set_allowed(InstructionSet set) { return max_instruction_set() >= set; }
