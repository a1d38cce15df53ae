//! The build script of every binary that runs in a pod (the three controllers
//! and cairn-instance; their Cargo.toml names it as `build`).
//!
//! On Linux with glibc it links their executables with packed relative
//! relocations (`-z pack-relative-relocs`, DT_RELR): the table the loader
//! reads at start shrinks from about 0.5 MiB, all of it resident, to 10–30
//! KB. That needs GNU ld 2.38 or lld 15 to link, and glibc 2.36 to run,
//! which the images have (Debian bookworm); kubectl-cairn, which runs on
//! users' machines, does not use this script.

fn main() {
    // Only this script decides the flags: no rerun when the crate's sources change.
    println!("cargo::rerun-if-changed={}", file!());
    let target = |key: &str| std::env::var(key).unwrap_or_default();
    if target("CARGO_CFG_TARGET_OS") == "linux" && target("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
