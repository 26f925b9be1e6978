//! Our own GGUF reader and streaming writer.
//!
//! Why not a crate: GGUF type ids are an open set that differs between engines (the TurboQuant
//! fork puts TQ4_1S at 46, other forks elsewhere, upstream rejects it). Existing crates map ids to a
//! closed enum and refuse or mangle unknown ids, and none writes them. Here a tensor's type id is
//! resolved through a target [`Profile`](crate::types::profile::Profile), and metadata keeps every
//! value's exact type and order so a read–write round trip is byte-identical. See docs/gguf.md.

pub mod reader;
pub(crate) mod value;
pub mod writer;

pub use reader::{GgufFile, TensorInfo};
pub use value::{GString, Value, ValueType};
pub use writer::{GgufWriter, TensorSpec};

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
