#!/usr/bin/env bash
# GPU container entrypoint of the two-container vLLM pod (Google's TPU/GPU vLLM guide): serve only when the
# node has NVIDIA GPUs (nvidia-smi on PATH, as the GKE GPU driver installs it), otherwise idle so the TPU
# container of the same pod can serve.
#
#   gpu_serve.sh COMMAND [ARGS...]   e.g. gpu_serve.sh python3 -m vllm.entrypoints.openai.api_server --port=8000
set -u

if [ "$#" -eq 0 ]; then
    echo "usage: gpu_serve.sh COMMAND [ARGS...]" >&2
    exit 2
fi

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

if command -v nvidia-smi >/dev/null 2>&1; then
    gpus="$(nvidia-smi -L 2>/dev/null || true)"
    echo "GPU found: ${gpus:-nvidia-smi listed no GPUs}; serving"
    exec "$@"
fi
idle "no nvidia-smi on PATH"
