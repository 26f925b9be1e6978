//! Lloyd-Max scalar quantizers (minimum-MSE codebooks) for the coordinate distributions that
//! TurboQuant formats meet, and for sample data.
//!
//! Distributions ([`Dist`]):
//! - `Beta { d }`: one coordinate of a uniformly random unit vector in R^d (what a randomly
//!   rotated, L2-normalized head vector looks like), density
//!   `f(x) = Γ(d/2) / (√π Γ((d-1)/2)) · (1-x²)^((d-3)/2)` on [-1, 1]; E[x²] = 1/d.
//! - `Gaussian { d }`: its large-d limit N(0, 1/d).
//! - `Normal01`: N(0, 1), the convention of the TQ weight tables (values in units of the block scale).
//! - `Empirical`: the empirical distribution of a sample (1-D k-means).
//!
//! Solver: centroids = conditional means of the cells, boundaries = midpoints. Cell masses and first
//! moments are closed forms (normal: Φ and φ; beta: the regularized incomplete beta and
//! `∫ x (1-x²)^m dx = -(1-x²)^(m+1) / (2(m+1))`). Starting from the companding approximation
//! (centroids at quantiles of the density ∝ f^(1/3)), the fixed-point equations
//! `t_j = (c_j(t) + c_{j+1}(t)) / 2` are solved by Newton's method on the boundaries (the Jacobian
//! is tridiagonal and analytic: ∂c_i/∂b = f(b)(b - c_i)/P_i, ∂c_i/∂a = f(a)(c_i - a)/P_i), with a
//! backtracking line search and a plain Lloyd step as fallback. Both densities are log-concave, so
//! the Lloyd-Max fixed point is unique (Fleischer 1964) and is the global optimum.
//!
//! MSE of any table `c` with nearest-neighbour (midpoint) cells:
//! `E[x²] - Σ_i c_i (2 M1_i - c_i P_i)`, which has no cancellation problem beyond E[x²] itself.

use super::special::{inc_beta_pair_ln, ln_beta, norm_pdf, norm_sf};

/// The distribution a codebook is fitted to.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Coordinate of a random unit vector in R^d (exact density, d >= 3).
    Beta { d: usize },
    /// N(0, 1/d), the large-d limit of `Beta`.
    Gaussian { d: usize },
    /// N(0, 1).
    Normal01,
    /// Empirical distribution of `samples` values with mean square `mean_sq`.
    Empirical { samples: usize, mean_sq: f64 },
}

impl Dist {
    /// Short name used by the CLI and in emitted headers.
    pub fn name(&self) -> &'static str {
        match self {
            Dist::Beta { .. } => "beta",
            Dist::Gaussian { .. } => "gaussian",
            Dist::Normal01 => "normal01",
            Dist::Empirical { .. } => "empirical",
        }
    }

    /// The head dim, when the distribution has one.
    pub fn dim(&self) -> Option<usize> {
        match *self {
            Dist::Beta { d } | Dist::Gaussian { d } => Some(d),
            _ => None,
        }
    }

    /// E[x²] of the distribution.
    pub fn second_moment(&self) -> f64 {
        match *self {
            Dist::Beta { d } | Dist::Gaussian { d } => 1.0 / d as f64,
            Dist::Normal01 => 1.0,
            Dist::Empirical { mean_sq, .. } => mean_sq,
        }
    }

    /// Human description of the density, for headers.
    pub fn describe(&self) -> String {
        match *self {
            Dist::Beta { d } => format!(
                "coordinate of a random unit vector in R^{d}, f(x) ~ (1-x^2)^{} on [-1,1]",
                (d as f64 - 3.0) / 2.0
            ),
            Dist::Gaussian { d } => format!("Gaussian N(0, 1/{d})"),
            Dist::Normal01 => "standard normal N(0, 1)".to_string(),
            Dist::Empirical { samples, .. } => format!("empirical, {samples} samples"),
        }
    }
}

/// A scalar codebook and how well it does on its distribution.
#[derive(Clone, Debug)]
pub struct Codebook {
    pub dist: Dist,
    /// Centroids, ascending.
    pub centroids: Vec<f64>,
    /// Decision thresholds, `levels - 1` of them: midpoints of adjacent centroids.
    pub thresholds: Vec<f64>,
    /// Mean squared error per coordinate.
    pub mse: f64,
    /// Solver iterations (Newton or Lloyd steps).
    pub iterations: usize,
    /// Largest centroid change in the last iteration (absolute units).
    pub last_step: f64,
}

impl Codebook {
    pub fn levels(&self) -> usize {
        self.centroids.len()
    }
    /// log2(levels) when the number of levels is a power of two.
    pub fn bits(&self) -> Option<u32> {
        let n = self.levels();
        n.is_power_of_two().then(|| n.trailing_zeros())
    }
    /// MSE relative to E[x²] (the "σ²" units of the literature).
    pub fn mse_normalized(&self) -> f64 {
        self.mse / self.dist.second_moment()
    }
    /// MSE per vector of `d` coordinates (for a unit vector, `E‖u - û‖²`); `None` without a dim.
    pub fn mse_per_vector(&self) -> Option<f64> {
        self.dist.dim().map(|d| self.mse * d as f64)
    }
}

/// Midpoint thresholds of an ascending table.
pub fn midpoints(c: &[f64]) -> Vec<f64> {
    c.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect()
}

/// A symmetric continuous density with closed-form tail and partial first moment.
#[derive(Clone, Copy, Debug)]
enum Model {
    /// N(0, σ²).
    Normal { sigma: f64 },
    /// f(x) = c (1-x²)^m on [-1, 1], c = 1 / B(½, m+1).
    SymBeta { m: f64, ln_c: f64 },
}

impl Model {
    fn of(dist: &Dist) -> Model {
        match *dist {
            Dist::Beta { d } => Model::sym_beta((d as f64 - 3.0) / 2.0),
            Dist::Gaussian { d } => Model::Normal {
                sigma: 1.0 / (d as f64).sqrt(),
            },
            Dist::Normal01 => Model::Normal { sigma: 1.0 },
            Dist::Empirical { .. } => {
                unreachable!("empirical distributions are fitted by fit_empirical")
            }
        }
    }

    fn sym_beta(m: f64) -> Model {
        Model::SymBeta {
            m,
            ln_c: -ln_beta(m + 1.0, 0.5),
        }
    }

    /// The density ∝ f^(1/3) (asymptotically optimal point density), for the initial guess.
    fn compander(&self) -> Model {
        match *self {
            Model::Normal { sigma } => Model::Normal {
                sigma: sigma * 3f64.sqrt(),
            },
            Model::SymBeta { m, .. } => Model::sym_beta(m / 3.0),
        }
    }

    fn hi(&self) -> f64 {
        match self {
            Model::Normal { .. } => f64::INFINITY,
            Model::SymBeta { .. } => 1.0,
        }
    }

    fn sigma(&self) -> f64 {
        match *self {
            Model::Normal { sigma } => sigma,
            Model::SymBeta { m, .. } => 1.0 / (2.0 * m + 3.0).sqrt(),
        }
    }

    fn pdf(&self, x: f64) -> f64 {
        match *self {
            Model::Normal { sigma } => norm_pdf(x / sigma) / sigma,
            Model::SymBeta { m, ln_c } => {
                if x.abs() >= 1.0 {
                    if m == 0.0 && x.abs() == 1.0 {
                        return ln_c.exp();
                    }
                    return 0.0;
                }
                (ln_c + m * (-x * x).ln_1p()).exp()
            }
        }
    }

    /// P(X > x) for x >= 0.
    fn tail(&self, x: f64) -> f64 {
        debug_assert!(x >= 0.0);
        match *self {
            Model::Normal { sigma } => {
                if x == f64::INFINITY {
                    0.0
                } else {
                    norm_sf(x / sigma)
                }
            }
            Model::SymBeta { m, .. } => {
                if x >= 1.0 {
                    return 0.0;
                }
                if x == 0.0 {
                    return 0.5;
                }
                // P(X > x) = ½ I_{1-x²}(m+1, ½)
                let t2 = x * x;
                let (_, q) = inc_beta_pair_ln(
                    0.5,
                    m + 1.0,
                    t2,
                    (1.0 - x) * (1.0 + x),
                    2.0 * x.ln(),
                    (-t2).ln_1p(),
                );
                0.5 * q
            }
        }
    }

    /// ∫_a^b x f(x) dx.
    fn m1(&self, a: f64, b: f64) -> f64 {
        match *self {
            Model::Normal { sigma } => {
                let pa = if a.is_finite() {
                    norm_pdf(a / sigma)
                } else {
                    0.0
                };
                let pb = if b.is_finite() {
                    norm_pdf(b / sigma)
                } else {
                    0.0
                };
                sigma * (pa - pb)
            }
            Model::SymBeta { m, ln_c } => {
                let g = |x: f64| -> f64 {
                    if x.abs() >= 1.0 {
                        0.0
                    } else {
                        ((m + 1.0) * (-x * x).ln_1p()).exp()
                    }
                };
                ln_c.exp() / (2.0 * (m + 1.0)) * (g(a) - g(b))
            }
        }
    }

    fn second_moment(&self) -> f64 {
        let s = self.sigma();
        s * s
    }
}

/// Cell statistics over the cells delimited by `t` (t[0] = lower end, t[n] = upper end).
struct Cells {
    mass: Vec<f64>,
    m1: Vec<f64>,
    mean: Vec<f64>,
}

fn cells(model: &Model, t: &[f64]) -> Cells {
    let n = t.len() - 1;
    let tails: Vec<f64> = t.iter().map(|&x| model.tail(x.abs())).collect();
    let mut mass = Vec::with_capacity(n);
    let mut m1 = Vec::with_capacity(n);
    let mut mean = Vec::with_capacity(n);
    for i in 0..n {
        let (a, b) = (t[i], t[i + 1]);
        let p = if a >= 0.0 {
            tails[i] - tails[i + 1]
        } else if b <= 0.0 {
            tails[i + 1] - tails[i]
        } else {
            1.0 - tails[i] - tails[i + 1]
        };
        let p = p.max(0.0);
        let q = model.m1(a, b);
        let c = if p > 1e-300 {
            (q / p).clamp(a, b)
        } else {
            // A cell with no mass (far tail): keep a finite representative inside it.
            let lo = if a.is_finite() { a } else { b - model.sigma() };
            let hi = if b.is_finite() { b } else { a + model.sigma() };
            0.5 * (lo + hi)
        };
        mass.push(p);
        m1.push(q);
        mean.push(c);
    }
    Cells { mass, m1, mean }
}

/// Quantile for p in (0, 1) of a symmetric model, by bisection on the tail.
fn quantile(model: &Model, p: f64) -> f64 {
    if p == 0.5 {
        return 0.0;
    }
    if p < 0.5 {
        return -quantile(model, 1.0 - p);
    }
    let target = 1.0 - p;
    let mut lo = 0.0;
    let mut hi = match model {
        Model::Normal { sigma } => 40.0 * sigma,
        Model::SymBeta { .. } => 1.0,
    };
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if model.tail(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-15 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// Residual of the fixed-point equations at the interior boundaries.
fn residual(t: &[f64], c: &[f64]) -> Vec<f64> {
    (1..t.len() - 1)
        .map(|j| t[j] - 0.5 * (c[j - 1] + c[j]))
        .collect()
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Solve a tridiagonal system (sub `a`, diag `b`, super `c`, rhs `d`) by the Thomas algorithm.
fn thomas(a: &[f64], b: &[f64], c: &[f64], d: &[f64]) -> Option<Vec<f64>> {
    let n = d.len();
    let mut cp = vec![0.0; n];
    let mut dp = vec![0.0; n];
    for i in 0..n {
        let den = b[i] - if i > 0 { a[i] * cp[i - 1] } else { 0.0 };
        if den.abs() < 1e-300 || !den.is_finite() {
            return None;
        }
        cp[i] = if i + 1 < n { c[i] / den } else { 0.0 };
        dp[i] = (d[i] - if i > 0 { a[i] * dp[i - 1] } else { 0.0 }) / den;
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = dp[i] - if i + 1 < n { cp[i] * x[i + 1] } else { 0.0 };
    }
    Some(x)
}

fn valid(model: &Model, t: &[f64]) -> bool {
    let hi = model.hi();
    t.windows(2).all(|w| w[0] < w[1]) && t[1] > -hi && t[t.len() - 2] < hi
}

/// Lloyd-Max codebook with `levels` centroids for an analytic distribution.
// One function on purpose: the fixed-point iteration, its convergence test and the two
// safeguards (monotone thresholds, tail clamping) share the iterate.
pub fn lloyd_max(dist: &Dist, levels: usize) -> Codebook {
    assert!(levels >= 1, "a codebook needs at least one level");
    if let Dist::Beta { d } | Dist::Gaussian { d } = *dist {
        assert!(d >= 3, "head dim must be >= 3");
    }
    let model = Model::of(dist);
    let sigma = model.sigma();
    let hi = model.hi();
    let n = levels;

    // Initial guess: companding quantiles.
    let comp = model.compander();
    let init: Vec<f64> = (0..n)
        .map(|i| quantile(&comp, (i as f64 + 0.5) / n as f64))
        .collect();
    let mut t = Vec::with_capacity(n + 1);
    t.push(-hi);
    t.extend(midpoints(&init));
    t.push(hi);

    let mut cs = cells(&model, &t);
    let mut iterations = 0;
    // Newton steps smaller than this leave an error of order step² (far below f64 noise).
    let newton_tol = 1e-10 * sigma;
    // Residual level that f64 evaluation of the cell means cannot improve on.
    let noise = 1e-13 * sigma;
    while n > 1 && iterations < 200 {
        iterations += 1;
        let r = residual(&t, &cs.mean);
        let rnorm = max_abs(&r);
        if rnorm <= noise {
            break;
        }
        // Jacobian of r w.r.t. the interior boundaries t[1..n] (tridiagonal).
        let m = n - 1;
        let (mut sub, mut dia, mut sup) = (vec![0.0; m], vec![0.0; m], vec![0.0; m]);
        // ∂c_i/∂t[i+1] (upper end of cell i) and ∂c_i/∂t[i] (lower end).
        let dup = |i: usize| -> f64 {
            let p = cs.mass[i];
            if p <= 1e-300 {
                0.5
            } else {
                model.pdf(t[i + 1]) * (t[i + 1] - cs.mean[i]) / p
            }
        };
        let dlo = |i: usize| -> f64 {
            let p = cs.mass[i];
            if p <= 1e-300 {
                0.5
            } else {
                model.pdf(t[i]) * (cs.mean[i] - t[i]) / p
            }
        };
        for k in 0..m {
            let j = k + 1; // boundary t[j] separates cells j-1 and j
            dia[k] = 1.0 - 0.5 * (dup(j - 1) + dlo(j));
            if k > 0 {
                sub[k] = -0.5 * dlo(j - 1);
            }
            if k + 1 < m {
                sup[k] = -0.5 * dup(j);
            }
        }
        let neg_r: Vec<f64> = r.iter().map(|x| -x).collect();
        let mut accepted = None;
        if let Some(delta) = thomas(&sub, &dia, &sup, &neg_r) {
            let mut lambda = 1.0;
            for _ in 0..40 {
                let mut t2 = t.clone();
                for k in 0..m {
                    t2[k + 1] += lambda * delta[k];
                }
                if valid(&model, &t2) {
                    let cs2 = cells(&model, &t2);
                    let r2 = max_abs(&residual(&t2, &cs2.mean));
                    if r2 < rnorm || r2 <= noise {
                        t = t2;
                        cs = cs2;
                        accepted = Some(lambda * max_abs(&delta));
                        break;
                    }
                }
                lambda *= 0.5;
            }
        }
        match accepted {
            Some(step) if step <= newton_tol => break,
            Some(_) => {}
            None => {
                // Plain Lloyd step (always improves the MSE).
                let mid = midpoints(&cs.mean);
                t[1..n].copy_from_slice(&mid);
                cs = cells(&model, &t);
            }
        }
    }
    // Convergence certificate: how far one more Lloyd step would move the centroids.
    let mut last_step = 0.0;
    if n > 1 {
        let mut t2 = t.clone();
        t2[1..n].copy_from_slice(&midpoints(&cs.mean));
        let cs2 = cells(&model, &t2);
        last_step = cs2
            .mean
            .iter()
            .zip(&cs.mean)
            .fold(0.0f64, |a, (x, y)| a.max((x - y).abs()));
    }

    // Exact symmetry: average c_i and -c_{n-1-i}.
    let raw = cs.mean;
    let mut c: Vec<f64> = (0..n).map(|i| 0.5 * (raw[i] - raw[n - 1 - i])).collect();
    if n % 2 == 1 {
        c[n / 2] = 0.0;
    }
    let mse = table_mse(&model, &c);
    Codebook {
        dist: dist.clone(),
        thresholds: midpoints(&c),
        centroids: c,
        mse,
        iterations,
        last_step,
    }
}

/// Lloyd-Max codebook with 2^bits levels.
pub fn lloyd_max_bits(dist: &Dist, bits: u32) -> Codebook {
    assert!((1..=12).contains(&bits), "bits must be in 1..=12");
    lloyd_max(dist, 1usize << bits)
}

fn table_mse(model: &Model, sorted: &[f64]) -> f64 {
    let n = sorted.len();
    let hi = model.hi();
    let mut t = Vec::with_capacity(n + 1);
    t.push(-hi);
    t.extend(midpoints(sorted));
    t.push(hi);
    let cs = cells(model, &t);
    let acc: f64 = sorted
        .iter()
        .enumerate()
        .map(|(i, &c)| c * (2.0 * cs.m1[i] - c * cs.mass[i]))
        .sum();
    (model.second_moment() - acc).max(0.0)
}

/// MSE per coordinate of an arbitrary table (nearest-centroid encoding) on an analytic distribution.
pub fn evaluate(dist: &Dist, table: &[f64]) -> f64 {
    let mut s = table.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("table values must not be NaN"));
    match dist {
        Dist::Empirical { .. } => panic!("use evaluate_empirical for sample data"),
        _ => table_mse(&Model::of(dist), &s),
    }
}

/// Sorted samples with prefix sums, for 1-D k-means.
pub struct Samples {
    sorted: Vec<f64>,
    pre1: Vec<f64>,
}

impl Samples {
    /// Build from raw values; NaN/inf values are rejected by the caller.
    pub fn new(values: &[f32]) -> Samples {
        let mut sorted: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        sorted.sort_by(|a, b| a.partial_cmp(b).expect("samples must be finite"));
        let mut pre1 = Vec::with_capacity(sorted.len() + 1);
        pre1.push(0.0);
        let mut s1 = 0.0;
        for &x in &sorted {
            s1 += x;
            pre1.push(s1);
        }
        Samples { sorted, pre1 }
    }
    pub fn len(&self) -> usize {
        self.sorted.len()
    }
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
    pub fn mean_sq(&self) -> f64 {
        self.sorted.iter().map(|x| x * x).sum::<f64>() / self.len() as f64
    }
    /// MSE of nearest-centroid coding with an ascending table.
    pub fn mse(&self, sorted_table: &[f64]) -> f64 {
        let th = midpoints(sorted_table);
        let mut k = 0;
        let mut acc = 0.0;
        for &x in &self.sorted {
            while k < th.len() && x >= th[k] {
                k += 1;
            }
            let e = x - sorted_table[k];
            acc += e * e;
        }
        acc / self.len() as f64
    }
    /// Index of the first sample >= v.
    fn lower(&self, v: f64) -> usize {
        self.sorted.partition_point(|&x| x < v)
    }
}

/// Lloyd's algorithm (1-D k-means) on sample data, from quantile initialisation, until the
/// partition no longer changes (at most 100 000 iterations).
pub fn fit_empirical(samples: &Samples, levels: usize) -> Codebook {
    assert!(levels >= 1 && !samples.is_empty());
    let n = samples.len();
    let k = levels.min(n);
    // Quantile initialisation: mean of each equal-count chunk.
    let mut c: Vec<f64> = (0..k)
        .map(|i| {
            let (a, b) = (i * n / k, ((i + 1) * n / k).max(i * n / k + 1));
            (samples.pre1[b] - samples.pre1[a]) / (b - a) as f64
        })
        .collect();
    dedup_ascending(&mut c, &samples.sorted);
    let mut cuts: Vec<usize> = Vec::new();
    let mut iterations = 0;
    let mut last_step = 0.0;
    while iterations < 100_000 {
        iterations += 1;
        let th = midpoints(&c);
        let new_cuts: Vec<usize> = th.iter().map(|&v| samples.lower(v)).collect();
        if new_cuts == cuts {
            last_step = 0.0;
            break;
        }
        let mut bounds = vec![0usize];
        bounds.extend(&new_cuts);
        bounds.push(n);
        let mut c2 = c.clone();
        for i in 0..c.len() {
            let (a, b) = (bounds[i], bounds[i + 1]);
            if b > a {
                c2[i] = (samples.pre1[b] - samples.pre1[a]) / (b - a) as f64;
            }
        }
        dedup_ascending(&mut c2, &samples.sorted);
        last_step = c2
            .iter()
            .zip(&c)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        c = c2;
        cuts = new_cuts;
    }
    // Fewer distinct samples than levels: pad by repeating the largest value.
    while c.len() < levels {
        c.push(*c.last().unwrap());
    }
    let mse = samples.mse(&c);
    Codebook {
        dist: Dist::Empirical {
            samples: n,
            mean_sq: samples.mean_sq(),
        },
        thresholds: midpoints(&c),
        centroids: c,
        mse,
        iterations,
        last_step,
    }
}

/// Keep centroids strictly ascending; a collapsed centroid is moved next to a distinct sample.
fn dedup_ascending(c: &mut Vec<f64>, sorted: &[f64]) {
    c.sort_by(|a, b| a.partial_cmp(b).unwrap());
    for i in 1..c.len() {
        if c[i] <= c[i - 1] {
            let j = sorted.partition_point(|&x| x <= c[i - 1]);
            c[i] = if j < sorted.len() {
                sorted[j]
            } else {
                f64::INFINITY
            };
        }
    }
    c.retain(|x| x.is_finite());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn normal01_standard_tables() {
        let cb = lloyd_max_bits(&Dist::Normal01, 1);
        assert!(close(
            cb.centroids[1],
            (2.0 / std::f64::consts::PI).sqrt(),
            1e-14
        ));
        assert!(close(cb.mse, 1.0 - 2.0 / std::f64::consts::PI, 1e-14));

        let cb = lloyd_max_bits(&Dist::Normal01, 2);
        assert!(close(cb.centroids[2], 0.4528, 5e-5) && close(cb.centroids[3], 1.5104, 5e-5));
        assert!(close(cb.mse, 0.1175, 5e-5), "{}", cb.mse);

        let cb = lloyd_max_bits(&Dist::Normal01, 3);
        for (got, want) in cb.centroids[4..]
            .iter()
            .zip([0.2451, 0.7560, 1.3439, 2.1519])
        {
            assert!(close(*got, want, 5e-5), "{got} vs {want}");
        }
        assert!(close(cb.mse, 0.03455, 5e-6), "{}", cb.mse);

        let cb = lloyd_max_bits(&Dist::Normal01, 4);
        assert!(close(cb.centroids[15], 2.7326, 5e-5));
        assert!(close(cb.mse, 0.009501, 5e-7), "{}", cb.mse);
        assert!(cb.last_step < 1e-10);
    }

    #[test]
    fn uniform_is_exact_for_d3() {
        // d = 3: the coordinate is uniform on [-1, 1]; the optimum is the uniform quantizer.
        for bits in 1..=6 {
            let cb = lloyd_max_bits(&Dist::Beta { d: 3 }, bits);
            let n = 1usize << bits;
            let step = 2.0 / n as f64;
            for (i, c) in cb.centroids.iter().enumerate() {
                assert!(
                    close(*c, -1.0 + step * (i as f64 + 0.5), 1e-12),
                    "bits {bits} i {i}"
                );
            }
            assert!(close(cb.mse, step * step / 12.0, 1e-14));
        }
    }

    #[test]
    fn beta_tends_to_gaussian() {
        for bits in [2, 4] {
            let b = lloyd_max_bits(&Dist::Beta { d: 4096 }, bits);
            let g = lloyd_max_bits(&Dist::Gaussian { d: 4096 }, bits);
            for (x, y) in b.centroids.iter().zip(&g.centroids) {
                assert!(((x - y) / y).abs() < 2e-3);
            }
        }
    }

    #[test]
    fn converges_for_all_bits_and_dims() {
        // 16384 is the CLI's largest beta d (`MAX_BETA_DIM`).
        for d in [3usize, 4, 5, 64, 96, 128, 160, 576, 4096, 16384] {
            for bits in 1..=8 {
                let cb = lloyd_max_bits(&Dist::Beta { d }, bits);
                if d >= 64 {
                    // Lighter tails than N(0, 1/d): the normalized MSE approaches the Gaussian
                    // limit from below (a precision loss shows up as overshoot).
                    let g = lloyd_max_bits(&Dist::Gaussian { d }, bits);
                    assert!(
                        cb.mse_normalized() < g.mse_normalized(),
                        "d {d} bits {bits}: beta {} >= gaussian {}",
                        cb.mse_normalized(),
                        g.mse_normalized()
                    );
                }
                let s = (1.0 / d as f64).sqrt();
                assert!(
                    cb.last_step < 1e-10 * s,
                    "d {d} bits {bits} step {}",
                    cb.last_step
                );
                // Lloyd conditions: boundaries are midpoints, centroids are cell means.
                let recheck = evaluate(&Dist::Beta { d }, &cb.centroids);
                assert!(((recheck - cb.mse) / cb.mse).abs() < 1e-9);
                assert!(cb.centroids.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }

    #[test]
    fn optimum_beats_perturbations() {
        let dist = Dist::Beta { d: 64 };
        let cb = lloyd_max_bits(&dist, 3);
        for i in 0..8 {
            for eps in [-1e-4, 1e-4] {
                let mut t = cb.centroids.clone();
                t[i] += eps;
                assert!(evaluate(&dist, &t) > cb.mse);
            }
        }
    }

    #[test]
    fn empirical_matches_analytic_on_large_sample() {
        // Deterministic quasi-normal sample: Φ^{-1} at (i + ½)/N.
        let n = 20_000;
        let model = Model::Normal { sigma: 1.0 };
        let v: Vec<f32> = (0..n)
            .map(|i| quantile(&model, (i as f64 + 0.5) / n as f64) as f32)
            .collect();
        let s = Samples::new(&v);
        let cb = fit_empirical(&s, 4);
        let exact = lloyd_max_bits(&Dist::Normal01, 2);
        for (x, y) in cb.centroids.iter().zip(&exact.centroids) {
            assert!((x - y).abs() < 5e-3, "{x} vs {y}");
        }
        assert!((cb.mse - exact.mse).abs() < 2e-3);
    }

    #[test]
    fn empirical_with_few_distinct_values() {
        let s = Samples::new(&[1.0, 1.0, 2.0, 2.0, 5.0]);
        let cb = fit_empirical(&s, 4);
        assert_eq!(cb.levels(), 4);
        assert!(cb.mse < 1e-12);
    }
}
