//! Source texts of the bundled kernels (`kernels/{cuda,metal,wgsl}/`), embedded in the binary
//! and compiled at run time by each backend; `TQ_KERNELS_DIR` overrides them.

use crate::error::{Error, Result};
use std::path::Path;

pub const CUDA_COMMON: &str = include_str!("../../kernels/cuda/common.cuh");
pub const CUDA_TQ: &str = include_str!("../../kernels/cuda/tq.cu");
pub const CUDA_TURBO: &str = include_str!("../../kernels/cuda/turbo.cu");
pub const CUDA_TQ2R: &str = include_str!("../../kernels/cuda/tq2r.cu");
pub const METAL_COMMON: &str = include_str!("../../kernels/metal/common.metal");
pub const METAL_TQ: &str = include_str!("../../kernels/metal/tq.metal");
pub const METAL_TURBO: &str = include_str!("../../kernels/metal/turbo.metal");
pub const METAL_TQ2R: &str = include_str!("../../kernels/metal/tq2r.metal");
pub const WGSL_COMMON: &str = include_str!("../../kernels/wgsl/common.wgsl");
pub const WGSL_TQ: &str = include_str!("../../kernels/wgsl/tq.wgsl");
pub const WGSL_TURBO: &str = include_str!("../../kernels/wgsl/turbo.wgsl");
pub const WGSL_TQ2R: &str = include_str!("../../kernels/wgsl/tq2r.wgsl");

/// The text of `kernels/<lang>/<file>`: the embedded copy, or with `TQ_KERNELS_DIR=DIR` the
/// file `DIR/<lang>/<file>` (to try a kernel edit without rebuilding; the harness and the
/// `--backend auto` failure test use it). A file that cannot be read is an error.
pub fn text(lang: &str, file: &str) -> Result<String> {
    if let Some(dir) = std::env::var_os("TQ_KERNELS_DIR") {
        let p = Path::new(&dir).join(lang).join(file);
        return std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e));
    }
    Ok(match (lang, file) {
        ("cuda", "common.cuh") => CUDA_COMMON,
        ("cuda", "tq.cu") => CUDA_TQ,
        ("cuda", "turbo.cu") => CUDA_TURBO,
        ("cuda", "tq2r.cu") => CUDA_TQ2R,
        ("metal", "common.metal") => METAL_COMMON,
        ("metal", "tq.metal") => METAL_TQ,
        ("metal", "turbo.metal") => METAL_TURBO,
        ("metal", "tq2r.metal") => METAL_TQ2R,
        ("wgsl", "common.wgsl") => WGSL_COMMON,
        ("wgsl", "tq.wgsl") => WGSL_TQ,
        ("wgsl", "turbo.wgsl") => WGSL_TURBO,
        ("wgsl", "tq2r.wgsl") => WGSL_TQ2R,
        _ => {
            return Err(Error::Unsupported(format!(
                "no bundled kernel source {lang}/{file}"
            )))
        }
    }
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tq as tqs;

    #[test]
    #[allow(clippy::excessive_precision)]
    fn wgsl_tables_match_the_cpu_reference() {
        fn bits(src: &str, name: &str) -> Vec<u32> {
            let start = src.find(&format!("var<private> {name}:")).expect(name);
            let body = &src[start..];
            let open = body.find("array<u32").unwrap();
            let body = &body[open..];
            let open = body.find('(').unwrap();
            let close = body.find(");").unwrap();
            body[open + 1..close]
                .split(',')
                .map(|t| t.trim().trim_end_matches('u'))
                .filter(|t| !t.is_empty())
                .map(|t| u32::from_str_radix(t.trim_start_matches("0x"), 16).unwrap())
                .collect()
        }
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(WGSL_TQ, "C4"), b(&tqs::C4));
        assert_eq!(bits(WGSL_TQ, "C3"), b(&tqs::C3));
        // The turbo codebooks are not in the sources: the host passes them as a buffer.
        assert!(!WGSL_TURBO.contains("var<private> CB"));
        assert!(WGSL_TQ.contains(&format!("0x{:08x}u", 0.176_776_695_296_636_88f32.to_bits())));
    }

    /// tq2_t's 1MAD constants are the format's in every kernel language (the tq2_t kernels live
    /// in the tq2r files: same bindings, scalars and rotation kernels).
    #[test]
    fn tq2t_constants_match_the_format() {
        use crate::types::tq2t;
        let inv = format!("0x{:08x}u", tq2t::MAD_INV_STD.to_bits());
        for src in [WGSL_TQ2R, CUDA_TQ2R, METAL_TQ2R] {
            assert!(src.contains(&format!(
                "TQ2T_INV_STD{}",
                if src == WGSL_TQ2R { ": u32 = " } else { " " }
            )));
            assert!(src.contains(&inv), "{inv}");
            assert!(src.contains(&format!("{}u", tq2t::MAD_A)));
            assert!(src.contains(&format!("{}u", tq2t::MAD_B)));
            assert!(src.contains(&format!("{}", tq2t::MAD_MEAN)));
            assert!(src.contains(&format!(
                "TQ2T_BYTES{}{}u",
                if src == WGSL_TQ2R { ": u32 = " } else { " " },
                tq2t::TQ2T_BYTES
            )));
        }
    }
}
