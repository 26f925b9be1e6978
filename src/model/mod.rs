//! CPU model runtime for llama-family decoders, layer-streaming (in progress).
