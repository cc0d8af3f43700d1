//! Standard output for the command line. Rust's `println!` panics when the reader has gone
//! (`herald tasks list | head -1`: EPIPE, since Rust ignores SIGPIPE), which printed a panic
//! and exited 101. A reader that stopped reading wanted no more output, so every command
//! writes through here and a closed pipe ends the process quietly with status 0, as
//! coreutils' tools end (there by SIGPIPE).

use std::io::Write;

/// Writes `args` to standard output; on a closed pipe exits 0, on any other write error exits
/// 1 with one line (there is no one left to hand the error to who could print it better).
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        exit_on(e);
    }
}

/// Writes bytes as they are (completion scripts, export lines), like [`write`].
pub fn write_bytes(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        exit_on(e);
    }
}

/// True for the error a write to a pipe whose reader has gone gets.
pub fn is_closed_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

fn exit_on(e: std::io::Error) -> ! {
    if is_closed_pipe(&e) {
        std::process::exit(0);
    }
    // eprintln! would panic as well if stderr is closed too.
    let _ = writeln!(std::io::stderr(), "herald: writing to standard output: {e}");
    std::process::exit(1);
}

/// `print!` through [`write`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::write(format_args!($($arg)*)) };
}

/// `println!` through [`write`].
macro_rules! outln {
    () => { $crate::cli::output::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

/// ` --name value` for a "more:" hint, the value quoted for a POSIX shell when it needs it, so
/// the hint copied as it is lists the same filtered results (an empty `value`: nothing).
pub fn hint_flag(name: &str, value: Option<&str>) -> String {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return String::new();
    };
    let plain = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._:-/@+=,".contains(c));
    if plain {
        format!(" --{name} {v}")
    } else {
        format!(" --{name} '{}'", v.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod hint_tests {
    use super::hint_flag;

    #[test]
    fn a_hint_flag_is_quoted_only_when_it_must_be() {
        assert_eq!(hint_flag("task", Some("a-1")), " --task a-1");
        assert_eq!(hint_flag("task", Some("it's x")), " --task 'it'\\''s x'");
        assert_eq!(hint_flag("task", None), "");
    }
}
