//! Writes the demonstration store that `docs/cli.md`'s examples were run on (the same store
//! the CLI's tests use): `cargo run -p reactifact-cli --example demo_store -- demo.db`.

#[path = "../tests/support/mod.rs"]
mod support;

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: demo_store PATH (a file that does not exist yet)");
        std::process::exit(2);
    };
    let path = std::path::PathBuf::from(path);
    if path.exists() {
        eprintln!("{} exists already", path.display());
        std::process::exit(2);
    }
    support::build(&path);
    println!("wrote {}", path.display());
}
