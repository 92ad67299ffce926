//! `kvlayout demo --engine nixl` against the NIXL library: the decode side in a second
//! process over NIXL on loopback, verified against the prefill side like the memcpy demo.
//!
//! The test is named `nixl_*`: scripts/test.sh skips it in the workspace run and runs it in
//! its NIXL run (`--test nixl -- nixl_ --test-threads=1`, NIXL's libraries on
//! `LD_LIBRARY_PATH`, `UCX_NET_DEVICES=lo`), one NIXL user at a time. Without the library it
//! prints `skipped: nixl: <why>`, unless `KVLAYOUT_REQUIRE_NIXL=1`, which fails it. (Without
//! the library, `--engine nixl` is one line and exit 2: tests/cli/demo.rs checks that.)

use std::process::Command;

#[test]
fn nixl_demo_decode_side_in_a_second_process_verifies() {
    if let Err(why) = kvlayout_connector::nixl::available() {
        assert!(
            std::env::var("KVLAYOUT_REQUIRE_NIXL").as_deref() != Ok("1"),
            "KVLAYOUT_REQUIRE_NIXL=1, but nixl: {why}"
        );
        println!("skipped: nixl: {why}");
        return;
    }
    for plan in ["staged", "direct"] {
        let args = [
            "demo",
            "--engine",
            "nixl",
            "--json",
            "--prompts",
            "40,23",
            "--blocks",
            "8",
            "--plan",
            plan,
        ];
        let o = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(args)
            .output()
            .expect("the kvlayout binary runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {:?} {err}", o.status);
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the record is JSON");
        assert_eq!(r["engine"], "nixl");
        assert_eq!(r["scenario"]["plan"], plan);
        assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
        assert_eq!(r["verification"]["elements_differing"], 0);
        // 63 tokens x 8 heads x 256 elements (K and V) x 2 layers.
        assert_eq!(r["verification"]["elements"], 63 * 8 * 256 * 2);
        let steps = r["steps"].as_array().expect("steps");
        assert_eq!(steps.len(), 8);
        for s in steps {
            assert!(s["bytes"].as_u64().unwrap() > 0, "{s}");
            // Only the steps that move data have a ratio to memcpy.
            let moves = ["write_kv", "transfer", "receive", "decode"]
                .contains(&s["step"].as_str().unwrap());
            assert_eq!(s["of_memcpy"].is_null(), !moves, "{s}");
        }
        // 5 blocks of 16 tokens (40 + 23 tokens) x 8 heads x 512 bytes x 2 layers.
        let transfer = steps.iter().find(|s| s["step"] == "transfer").unwrap();
        assert_eq!(transfer["bytes"], 5 * 16 * 8 * 512 * 2);
        println!(
            "nixl demo ({plan}): transfer {:.3} ms, {:.2} x memcpy; whole run {:.0} ms",
            transfer["ms"].as_f64().unwrap(),
            transfer["of_memcpy"].as_f64().unwrap(),
            r["wall_ms"].as_f64().unwrap()
        );
    }
}
