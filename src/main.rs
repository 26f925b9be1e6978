//! Thin binary: all logic lives in the library (`tq::cli`).
fn main() {
    std::process::exit(tq::cli::main());
}
