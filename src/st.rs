//! safetensors files (header-level view for `inspect`; the HF model source builds on it).
