//! Fast Walsh–Hadamard transform (unnormalized Sylvester butterfly).

/// In-place unnormalized FWHT, scalar reference. `x.len()` must be a power of two.
/// Butterfly order is the engines' (`step = 1, 2, 4, ...`), so f32 results are bit-exact with them.
pub fn fwht_scalar(x: &mut [f32]) {
    let n = x.len();
    assert!(n.is_power_of_two(), "FWHT length {n} is not a power of two");
    let mut step = 1;
    while step < n {
        let mut i = 0;
        while i < n {
            for j in i..i + step {
                let a = x[j];
                let c = x[j + step];
                x[j] = a + c;
                x[j + step] = a - c;
            }
            i += 2 * step;
        }
        step *= 2;
    }
}
