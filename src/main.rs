use std::process::ExitCode;

fn main() -> ExitCode {
    smolchat::cli::main()
}
