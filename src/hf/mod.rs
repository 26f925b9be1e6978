//! Hugging Face model directories (config.json + safetensors shards + tokenizer.json) as a TensorSource (in progress).
