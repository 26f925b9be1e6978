//! Thin binary: parse flags, resolve them once into plain values, make one library call, print.
//! All logic lives in the library (`tq`); `cli` is not part of its API.
mod cli;

fn main() {
    std::process::exit(cli::main());
}
