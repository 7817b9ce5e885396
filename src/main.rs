fn main() -> std::process::ExitCode {
    python_code_sandbox::cli::main()
}
