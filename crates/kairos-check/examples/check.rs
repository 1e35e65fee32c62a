//! `cargo run -p kairos-check --example check -- MODEL FILE`: prints the report.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: check MODEL FILE");
        std::process::exit(3);
    }
    let run = || -> Result<bool, kairos_check::CheckError> {
        let model: kairos_check::Model = args[1].parse()?;
        let h = kairos_check::load_history(std::path::Path::new(&args[2]))?;
        let r = kairos_check::check(&h, model)?;
        print!("{r}");
        Ok(r.valid)
    };
    match run() {
        Ok(v) => std::process::exit(if v { 0 } else { 1 }),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(3)
        }
    }
}
