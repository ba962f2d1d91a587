#!/usr/bin/env bash
# TPU container entrypoint of the two-container vLLM pod (Google's TPU/GPU vLLM guide): serve only when the
# node has a TPU, otherwise idle so the GPU container of the same pod can serve.
#
#   tpu_serve.sh COMMAND [ARGS...]   e.g. tpu_serve.sh python3 -m vllm.entrypoints.openai.api_server --port=8000
#
# A TPU is present when /dev/vfio/0 (TPU VMs with VFIO) or /dev/accel0 exists under INTERLUDE_DEVICE_ROOT
# (default: the real root; the local cloud points it at a per-node fake root). TPU_ACCELERATOR_TYPE and
# TPU_TOPOLOGY come from the environment (set from the node's labels) and are passed on to the command.
set -u

if [ "$#" -eq 0 ]; then
    echo "usage: tpu_serve.sh COMMAND [ARGS...]" >&2
    exit 2
fi

root="${INTERLUDE_DEVICE_ROOT:-}"
root="${root%/}"

idle() {
    echo "$1; idling (the other container of this pod serves)"
    sleeper=""
    trap 'if [ -n "${sleeper}" ]; then kill "${sleeper}" 2>/dev/null; fi; exit 0' TERM INT
    while true; do
        sleep 3600 &
        sleeper="$!"
        wait "${sleeper}"
    done
}

if [ -e "${root}/dev/vfio/0" ] || [ -e "${root}/dev/accel0" ]; then
    echo "TPU found: accelerator type ${TPU_ACCELERATOR_TYPE:-unset}, topology ${TPU_TOPOLOGY:-unset}; serving"
    if [ -z "${TPU_ACCELERATOR_TYPE:-}" ] || [ -z "${TPU_TOPOLOGY:-}" ]; then
        echo "warning: TPU_ACCELERATOR_TYPE or TPU_TOPOLOGY is not set; the TPU runtime may guess wrong" >&2
    fi
    exec "$@"
fi
idle "no TPU device (${root}/dev/vfio/0, ${root}/dev/accel0)"
