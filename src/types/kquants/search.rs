//! ggml's scale searches shared by the k-quant encoders (`make_qkx2_quants`, `make_qx_quants`,
//! `make_q3_quants`), in ggml's f32 evaluation order.

use super::{nearest_int, GROUP_MAX_EPS};

/// ggml's `make_qkx2_quants`: asymmetric `scale * l - min` quantization of `x` to `0..=nmax`
/// with per-value `weights`, refining the scale over `nstep + 1` trial inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)` by weighted least squares, keeping the trial with
/// the smallest weighted error (absolute if `use_mad`, squared otherwise). Returns
/// `(scale, the_min)` with the levels in `l`; `the_min` is `-min` (>= 0).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_qkx2_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l_out: &mut [u8; N],
    laux: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    // Each pass first computes all levels (independent per value, so it vectorizes), then runs the
    // f32 accumulations strictly in index order as the C loop does.
    let mut xm = [0f32; N];
    for i in 0..N {
        xm[i] = x[i] - min;
    }
    for i in 0..N {
        l_out[i] = nearest_int(iscale * xm[i]).clamp(0, nmax) as u8;
    }
    for i in 0..N {
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        for i in 0..N {
            laux[i] = nearest_int(iscale * xm[i]).clamp(0, nmax) as u8;
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..N {
            let w = weights[i];
            let lf = laux[i] as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut diffs = [0f32; N];
            for i in 0..N {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                diffs[i] = weights[i] * if use_mad { diff.abs() } else { diff * diff };
            }
            let mut cur_error = 0.0f32;
            for v in diffs {
                cur_error += v;
            }
            if cur_error < best_error {
                *l_out = *laux;
                best_error = cur_error;
                scale = this_scale;
                // Later trials use the new min, in `x - min` and in `max - min` (as in C).
                min = this_min;
                for i in 0..N {
                    xm[i] = x[i] - min;
                }
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type = 1`: symmetric levels `-nmax..nmax-1` stored
/// `+ nmax` in `l_out`, the sign of the scale chosen so the largest |x| maps to `-nmax`, then 18
/// trial inverse scales `-(nmax + 0.1 * is) / max` scored by `sumlx^2 / suml2` under the weights
/// `qw` (an importance matrix: q6_K's raw importances; q3_K's, q4_0's and q5_0's
/// `imp·sqrt(σ² + x²)`), or `x^2` without (the reference quantizers).
#[inline(always)]
pub(crate) fn make_qx_quants_rmse1<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    qw: Option<&[f32; N]>,
    l_out: &mut [i8; N],
) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    // w (x^2 without weights) and w * x, as the C code forms them before multiplying by the
    // level.
    let mut w = [0f32; N];
    let mut wx = [0f32; N];
    for i in 0..N {
        w[i] = match qw {
            Some(q) => q[i],
            None => x[i] * x[i],
        };
        wx[i] = w[i] * x[i];
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let mut l = [0i32; N];
    for i in 0..N {
        l[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l[i] + nmax) as i8;
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..N {
        let lf = l[i] as f32;
        sumlx += wx[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1f32 * is as f32) / max;
        for i in 0..N {
            l[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        }
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..N {
            let lf = l[i] as f32;
            sumlx += wx[i] * lf;
            suml2 += w[i] * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..N {
                l_out[i] = (nmax + l[i]) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse = true`: symmetric levels `-nmax..nmax-1` from
/// `-nmax / max`, then up to 5 sweeps of coordinate descent on the weighted (`x^2`) least-squares
/// fit, each value moved to its best level given the others. Levels stored `+ nmax`.
#[inline(always)]
pub(super) fn make_q3_quants_rmse(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out[..n].iter_mut() {
        *l = (*l as i32 + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `make_qp_quants`: non-negative `x` onto levels `0..=nmax` with weights `w` (the
/// importance-matrix k-quants quantize their sub-block scales and mins with it). The first
/// inverse scale `nmax / max`, eight more `(nmax + 0.1·k) / max` (`k = ±1..=±4`) scored by the
/// weighted squared error, then up to five passes of per-level least-squares moves. Returns the
/// least-squares scale, the levels in `l[..x.len()]`, kept as ggml's `uint8_t` (a negative level
/// wraps, as the C store does). f32 arithmetic in the C order.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], w: &[f32], l: &mut [u8]) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    for &v in x {
        // C's `MAX(max, x)`.
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let li = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as u8;
        sumlx += w[i] * x[i] * li as f32;
        suml2 += w[i] * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let wi = w[i];
            let li = l[i] as f32;
            let mut slx = sumlx - wi * x[i] * li;
            let mut sl2 = suml2 - wi * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    slx += wi * x[i] * new_l as f32;
                    sl2 += wi * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}
