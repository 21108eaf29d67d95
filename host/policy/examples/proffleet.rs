use pinset_policy::*;
fn main() {
    let rt = WasmRuntime::new().unwrap();
    let m = rt
        .load_fleet(
            EMBEDDED_DEFAULT_NAME,
            EMBEDDED_DEFAULT,
            None,
            Limits::default(),
        )
        .unwrap();
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2000);
    let nodes: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(300);
    let request = synth::fleet(nodes);
    let t = std::time::Instant::now();
    for _ in 0..n {
        m.instance().grant(&request).unwrap();
    }
    println!("{:?} per", t.elapsed() / n as u32);
}
