#!/usr/bin/env bash
# Run a command as on an older x86-64 CPU kind, on this one:
#
#   bash scripts/cpu_standin.sh avx2   COMMAND...   # AVX2 + FMA, no AVX-512, no bf16 units (Zen 2/3, Haswell..Comet Lake)
#   bash scripts/cpu_standin.sh avx512 COMMAND...   # AVX-512 without BF16 (Skylake-SP, Cascade Lake)
#
# What it changes: oneDNN's instruction-set cap (ONEDNN_MAX_CPU_ISA: its bf16 GEMMs are refused
# under AVX2 with the very error a Zen 3 gives, "could not create a primitive descriptor", and
# emulated under AVX512_CORE_VNNI), ATen's vectorised kernels (ATEN_CPU_CAPABILITY) and MKL's
# code path (MKL_ENABLE_INSTRUCTIONS). scratchbert's cpu_gemm reads oneDNN's cap, so it finds no
# bf16 units, as on those CPUs. What it does not change: torch.cpu.get_capabilities() still
# reports this CPU's flags (cpuinfo reads CPUID), the core, caches and memory stay this machine's
# (speeds are not those CPUs'), and a kind newer than this CPU cannot be stood in for: ATen runs
# the kernels ATEN_CPU_CAPABILITY names without asking the CPU, so AVX-512 kernels on a Zen 3
# die of "Illegal instruction". Such a kind (or any kind on a CPU that is not x86-64) is refused
# with exit status 77, the "skipped" of autotools test suites, before COMMAND runs.
set -euo pipefail
kind=${1:?usage: cpu_standin.sh avx2|avx512 COMMAND...}
shift
case "$kind" in
    avx2)
        needs="avx2 fma"
        export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    avx512)
        needs="avx512f avx512bw avx512vl avx512dq"  # ATen's AVX-512 kernels: all four
        export ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ;;
    *) echo "cpu_standin.sh: unknown kind '$kind': use avx2 or avx512" >&2; exit 2 ;;
esac
cpuinfo=${CPU_STANDIN_CPUINFO:-/proc/cpuinfo}  # another file only in tests/test_scripts.py
flags=" $(grep -m1 '^flags' "$cpuinfo" 2>/dev/null | cut -d: -f2) "
for flag in $needs; do
    if [[ "$flags" != *" $flag "* ]]; then
        echo "CPU stand-in '$kind' skipped: this CPU has no $flag, and a stand-in can only hold a CPU to an older kind" >&2
        exit 77
    fi
done
echo "CPU stand-in '$kind': ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS" >&2
exec "$@"
