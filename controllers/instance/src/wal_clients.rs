//! The subcommands PostgreSQL runs for each WAL file, `archive_command`
//! (`wal-archive`) and `restore_command` (`wal-restore`): thin clients of
//! the instance's archiver socket, without a runtime or telemetry. Their
//! exit codes are what PostgreSQL acts on.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::{archive, restore};

/// `archive_command`'s client: `wal-archive --socket <socket> <file>`.
#[derive(Parser)]
struct WalArchive {
    #[arg(long)]
    socket: PathBuf,
    /// PostgreSQL's `%p`.
    file: PathBuf,
}

/// `restore_command`'s client: `wal-restore --socket <socket> <name> <path>`.
#[derive(Parser)]
struct WalRestore {
    #[arg(long)]
    socket: PathBuf,
    /// PostgreSQL's `%f`.
    name: String,
    /// PostgreSQL's `%p`.
    path: PathBuf,
}

/// `wal-archive`, its arguments after the program's name: success once the
/// file is stored, failure otherwise (PostgreSQL tries again).
pub fn archive(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = WalArchive::parse_from(args);
    match archive::request(&args.socket, &args.file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("cairn-instance wal-archive: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `wal-restore`, its arguments after the program's name.
pub fn restore(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = WalRestore::parse_from(args);
    match restore::request(&args.socket, &args.name, &args.path) {
        Ok(true) => ExitCode::SUCCESS,
        // Not archived: PostgreSQL's end of the archive.
        Ok(false) => ExitCode::FAILURE,
        // Any other failure must not read as the end of the archive
        // (recovery would end early and promote): an exit code above
        // 125 stops the server, and the instance starts it again.
        Err(message) => {
            eprintln!("cairn-instance wal-restore: {message}");
            ExitCode::from(255)
        }
    }
}
