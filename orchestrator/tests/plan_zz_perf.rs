use orchestrator::plan::parse_plan_toml;
use std::path::Path;
#[test]
fn perf() {
    let n = 10_000;
    let mut chain = String::new();
    let mut sweep = String::from("[[stage]]\nname = \"base\"\nkind = \"train\"\n");
    let mut bad = String::new();
    for i in 0..n {
        chain += &format!("[[stage]]\nname = \"s{i}\"\ncommand = [\"cp\", \"{{input.s{}}}\", \"{{output}}\"]\nafter = [{}]\n", i.max(1) - 1, if i == 0 { String::new() } else { format!("\"s{}\"", i - 1) });
        sweep += &format!("[[stage]]\nname = \"ft{i}\"\nkind = \"train\"\nafter = [\"base\"]\ninit = \"base\"\nparams = {{ steps = 10, seed = {i} }}\n[[stage]]\nname = \"ev{i}\"\nkind = \"eval\"\nafter = [\"ft{i}\"]\ninit = \"ft{i}\"\n");
        bad += &format!("[[stage]]\nname = \"b{i}\"\ncommand = [\"true\"]\nafter = [\"x{i}\"]\n");
    }
    chain = chain.replacen("[\"cp\", \"{input.s0}\", \"{output}\"]", "[\"true\"]", 1);
    for (name, text) in [("chain", &chain), ("sweep", &sweep), ("bad", &bad)] {
        let t = std::time::Instant::now();
        let r = parse_plan_toml(text, name, Path::new("/tmp"));
        println!("{name}: {} bytes, {:?}, ok={} diags={}", text.len(), t.elapsed(), r.is_ok(), r.as_ref().err().map_or(0, |e| e.diagnostics.len()));
        if let Err(e) = &r { println!("{}", e.diagnostics[0]); }
    }
}
