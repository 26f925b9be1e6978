//! Throughput benchmarks (run with `cargo bench --bench throughput`). Filled per subsystem.
fn main() {}
