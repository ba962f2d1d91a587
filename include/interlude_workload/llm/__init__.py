"""The reference language model: a small Llama in JAX, its tokenizer and data, and its Hugging Face export.

Runs on the accelerator machine (no Airflow imports). Importing this package imports nothing: the vLLM
stand-in takes :mod:`.numpy_forward` (numpy + safetensors only) without pulling in JAX.

* :mod:`.config`: ``LlamaConfig``, the architecture, and its ``config.json`` for ``LlamaForCausalLM``.
* :mod:`.model`: the JAX forward, loss and greedy generation over a dict of HF-named parameters.
* :mod:`.train_step`: the train state (params, AdamW state, data key, step), batches, the jitted step.
* :mod:`.tokenizer`: the byte-level BPE (512 ids) shipped in ``include/data/tokenizer/``.
* :mod:`.corpus`: the generated pre-training corpus and each day's fine-tuning slice.
* :mod:`.export`: the Hugging Face directory, verified against the JAX model.
* :mod:`.numpy_forward`: the same forward in numpy from ``model.safetensors`` + ``config.json``.
"""
