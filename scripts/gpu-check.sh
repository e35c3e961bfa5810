#!/usr/bin/env bash
# The whole verdict of the CUDA data path (issue 17) on a lent GPU machine,
# in one command, under one time bound. See docs/gpu.md.
#
#   scripts/gpu-check.sh --pack   (here, on a development machine; no GPU needed)
#       Builds build-gpu/ (RelWithDebInfo, -DKVT_CUDA=ON: the kernel fatbin
#       embedded) and copies what the GPU machine needs to run it into
#       .gpucarry/ (git-ignored, a few MiB): the CLI, the CUDA tests,
#       libkvtier.so, the shared libraries they load that are not glibc
#       (xxhash, cjson, sodium, uring, cmocka, UCX and its modules) and
#       ucx_perftest. The GPU machine cannot reach any package registry, and
#       its image has CMake and nvcc but not Debian's -dev packages.
#
#   scripts/gpu-check.sh          (there; with the device tool:
#                                  run(command="scripts/gpu-check.sh", carry=[".gpucarry"]))
#       1. env: nvidia-smi, nvcc, CPUs;
#       2. build from source with -DKVT_CUDA=ON (only the targets below); if
#          that fails (missing deps), the carried prebuilt binaries are used
#          and the verdict says so;
#       3. tests/unit/test_cuda_plan and test_cuda (a "skipped: no CUDA
#          device" there is a FAILURE: this script runs only where a GPU is);
#          python/tests/test_cuda_memory and test_vllm_cuda_torch (the vLLM
#          connector) with real torch CUDA tensors, when torch sees the GPU;
#       4. kvtier bench copy --device cuda --json (target: best mode's
#          gather and scatter >= 0.9x one contiguous cudaMemcpy);
#       5. kvtier bench pd --json (16 cores: the UCX hand-off ratio).
#       Results go to $OUT (or gpu-check-out/ when OUT is unset), at most 8
#       files: env.txt build.log tests.log bench_copy_cuda.json
#       bench_pd.json verdict.txt. The last line printed is the verdict.
#
# GPU_CHECK_PREBUILT=1 skips the source build and runs the carried binaries.
# Time bound: GPU_CHECK_SECONDS (default 480) for everything; each step gets
# at most what is left (timeout), and steps past the bound are reported as
# not run. Exit status: 0 when every step passed and the copy target was met,
# 1 otherwise.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

if [ "${1:-}" = "--pack" ]; then
    set -e
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_CUDA=ON >/dev/null
    cmake --build build-gpu -j"$(nproc)" --target kvtier_cli kvtier test_cuda test_cuda_plan
    rm -rf .gpucarry
    mkdir -p .gpucarry/bin .gpucarry/lib
    cp build-gpu/kvtier build-gpu/tests/test_cuda build-gpu/tests/test_cuda_plan .gpucarry/bin/
    cp -L build-gpu/libkvtier.so .gpucarry/lib/
    libdir=/usr/lib/x86_64-linux-gnu
    objs=".gpucarry/bin/kvtier .gpucarry/bin/test_cuda .gpucarry/lib/libkvtier.so"
    for l in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0; do
        [ -e "$libdir/$l" ] && cp -L "$libdir/$l" .gpucarry/lib/ && objs="$objs $libdir/$l"
    done
    if [ -d "$libdir/ucx" ]; then
        cp -rL "$libdir/ucx" .gpucarry/lib/ucx
        objs="$objs $(ls "$libdir"/ucx/*.so* 2>/dev/null | tr '\n' ' ')"
    fi
    if command -v ucx_perftest >/dev/null; then
        cp "$(command -v ucx_perftest)" .gpucarry/bin/
        objs="$objs .gpucarry/bin/ucx_perftest"
    fi
    # Every non-glibc library these load (glibc itself is the GPU machine's).
    for o in $objs; do
        ldd "$o" 2>/dev/null | awk '/=> \//{print $3}'
    done | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) ;;
            libcuda.so*|libcudart.so*|libnvidia*) ;;
            *) cp -Ln "$lib" .gpucarry/lib/ 2>/dev/null || true ;;
        esac
    done
    cp "$(ls -1 "$libdir"/libcmocka.so.0 2>/dev/null)" .gpucarry/lib/ 2>/dev/null || true
    du -sh .gpucarry
    echo "packed: run scripts/gpu-check.sh on the GPU machine with carry [\".gpucarry\"]"
    exit 0
fi

limit=${GPU_CHECK_SECONDS:-480}
start=$(date +%s)
out=${OUT:-$here/gpu-check-out}
mkdir -p "$out"
verdict_notes=()
failed=0
left() { echo $((limit - ($(date +%s) - start))); }
note() { verdict_notes+=("$1"); echo "gpu-check: $1"; }
# run NAME LOG CMD...: CMD under what is left of the bound, appended to LOG.
run() {
    local name=$1 log=$2
    shift 2
    local t
    t=$(left)
    if [ "$t" -le 10 ]; then
        note "$name: NOT RUN (time bound of ${limit}s reached)"
        failed=1
        return 124
    fi
    echo "=== $name (up to ${t}s): $*" >>"$log"
    timeout -k 5 "$t" "$@" >>"$log" 2>&1
    local rc=$?
    echo "=== $name: rc=$rc" >>"$log"
    return $rc
}

# 1. env
{
    echo "date: $(date -u)"; uname -a; echo "cpus: $(nproc)"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    nvcc --version 2>&1 | tail -2 || echo "nvcc: not available"
    echo "git: $(git rev-parse HEAD 2>/dev/null || echo '?')"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

# The CUDA runtime and driver: where the image keeps them.
for d in /usr/local/cuda/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

# The carried libraries (UCX for bench pd, ...) after the image's own.
if [ -d .gpucarry/lib ]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$here/.gpucarry/lib"
    ldconfig -p 2>/dev/null | grep -q 'libucs.so.0 ' || export UCX_MODULE_DIR=$here/.gpucarry/lib/ucx
fi

# 2. build
bin=""
if [ -z "${GPU_CHECK_PREBUILT:-}" ] && command -v cmake >/dev/null && run build "$out/build.log" cmake -S . -B build-gpu \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_CUDA=ON &&
   run build "$out/build.log" cmake --build build-gpu -j"$(nproc)" \
        --target kvtier_cli kvtier test_cuda test_cuda_plan; then
    bin=build-gpu
    cli=build-gpu/kvtier
    tcuda=build-gpu/tests/test_cuda
    tplan=build-gpu/tests/test_cuda_plan
    lib=build-gpu/libkvtier.so
    note "build from source (-DKVT_CUDA=ON): ok"
elif [ -x .gpucarry/bin/kvtier ]; then
    bin=.gpucarry
    cli=.gpucarry/bin/kvtier
    tcuda=.gpucarry/bin/test_cuda
    tplan=.gpucarry/bin/test_cuda_plan
    lib=.gpucarry/lib/libkvtier.so
    export LD_LIBRARY_PATH=$here/.gpucarry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$here/.gpucarry/bin:$PATH
    export UCX_MODULE_DIR=$here/.gpucarry/lib/ucx
    if [ -n "${GPU_CHECK_PREBUILT:-}" ]; then
        note "build from source skipped (GPU_CHECK_PREBUILT); using the carried prebuilt binaries from .gpucarry"
    else
        note "build from source FAILED here (see build.log: usually Debian's -dev packages are missing); using the carried prebuilt binaries from .gpucarry"
    fi
else
    note "build FAILED and no .gpucarry to fall back on (run scripts/gpu-check.sh --pack first and carry .gpucarry)"
    echo "gpu-check: VERDICT FAIL (nothing to run)" | tee "$out/verdict.txt"
    exit 1
fi

# 3. tests
tlog=$out/tests.log
: >"$tlog"
if run test_cuda_plan "$tlog" "$tplan"; then note "test_cuda_plan: passed"; else note "test_cuda_plan: FAILED"; failed=1; fi
if run test_cuda "$tlog" "$tcuda"; then
    if grep -q "skipped: no CUDA device" "$tlog"; then
        note "test_cuda: the device tests SKIPPED on a GPU machine: $(grep -m1 'skipped: no CUDA device' "$tlog")"
        failed=1
    else
        note "test_cuda: passed on the device ($(grep -c 'verified' "$tlog") byte-verified round trips)"
    fi
else
    note "test_cuda: FAILED"
    failed=1
fi
py=python3
if $py -c 'import torch, numpy; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    if (cd python/tests && KVTIER_LIB=$here/$lib PYTHONPATH=$here/python run python_cuda "$tlog" \
            $py -m unittest -v test_cuda_memory); then
        note "python test_cuda_memory (torch CUDA tensors): passed"
    else
        note "python test_cuda_memory: FAILED"
        failed=1
    fi
    # The vLLM connector with real torch CUDA KV (FlashAttention NHD/HND,
    # FlashInfer, MLA in-process; one engine to another through kvtier serve).
    if (cd python/tests && KVTIER_LIB=$here/$lib KVTIER_BIN=$here/$cli PYTHONPATH=$here/python \
            run python_vllm_cuda "$tlog" $py -m unittest -v test_vllm_cuda_torch) &&
       ! grep -q "skipped: no CUDA device (torch" "$tlog"; then
        note "python test_vllm_cuda_torch (vLLM connector, torch CUDA KV): passed"
    else
        note "python test_vllm_cuda_torch: FAILED"
        failed=1
    fi
else
    note "python test_cuda_memory, test_vllm_cuda_torch: not run (no python3 with torch+numpy seeing a GPU)"
fi

# 4. bench copy --device cuda
copy_json=$out/bench_copy_cuda.json
run bench_copy_cuda "$out/tests.log" sh -c "$cli bench copy --device cuda --json > $copy_json"
rc=$?
ratio=$(sed -n 's/.*"min_best_ratio": \([0-9.]*\).*/\1/p' "$copy_json" 2>/dev/null)
if [ $rc -eq 0 ] && [ -n "$ratio" ]; then
    if awk -v r="$ratio" 'BEGIN{exit !(r >= 0.9)}'; then
        note "bench copy --device cuda: verified; worst best-mode ratio $ratio (target >= 0.9): MET"
    else
        note "bench copy --device cuda: verified; worst best-mode ratio $ratio (target >= 0.9): NOT MET"
        failed=1
    fi
else
    note "bench copy --device cuda: FAILED (rc $rc; see tests.log)"
    failed=1
fi

# 5. bench pd (the UCX hand-off ratio on 16 cores). Its ucx_perftest
# baseline is /usr/bin/ucx_perftest: the carried one goes there when the
# image lacks it (the lent machine is disposable; commands run as root).
if [ ! -x /usr/bin/ucx_perftest ] && [ -x .gpucarry/bin/ucx_perftest ]; then
    cp .gpucarry/bin/ucx_perftest /usr/bin/ 2>/dev/null || true
fi
pd_json=$out/bench_pd.json
if run bench_pd "$out/tests.log" sh -c "$cli bench pd --json > $pd_json"; then
    ucx=$(sed -n 's/.*"ucx_ratio": \([0-9.a-z]*\).*/\1/p' "$pd_json")
    note "bench pd: ucx_ratio ${ucx:-?} (vs ucx_perftest; target >= 0.8), cpus $(nproc)"
else
    note "bench pd: FAILED or timed out (see tests.log)"
    failed=1
fi

elapsed=$(( $(date +%s) - start ))
{
    for n in "${verdict_notes[@]}"; do echo "  $n"; done
    if [ $failed -eq 0 ]; then
        echo "gpu-check: VERDICT PASS in ${elapsed}s (binaries: $bin)"
    else
        echo "gpu-check: VERDICT FAIL in ${elapsed}s (binaries: $bin; see the lines above and $out)"
    fi
} | tee "$out/verdict.txt"
exit $failed
