//! `kvlayout demo`, the main job: a prompt's KV cache moved from a prefill instance to a
//! decode instance of another layout, TP size and block size, then decoded and verified.
//!
//! The steps, each reported on one line ([`step::Step`]): `write_kv` of the prompts into the
//! prefill ranks' caches ([`prefill`]); the handshake, the compatibility check, the plan
//! (direct or staged), the transfer, the post-receive operation and `paged_decode` on every
//! decode rank ([`rank`]); the verification against the reference ([`verify`]). The engine is
//! the in-process memcpy engine, or NIXL with the decode side in a second process
//! ([`nixl`]).
//!
//! It owns the scenario's flags ([`scenario`]) and the report; every layout, plan and byte
//! run comes from `kvlayout` and `kvlayout-connector`.

use std::time::Instant;

use kvlayout::ops::{AnyBackend, Backend};

use crate::CliError;

mod budget;
mod model_check;
mod nixl;
mod prefill;
mod rank;
mod report;
mod scenario;
mod seeded;
mod step;
mod verify;

pub(crate) use nixl::PeerArgs;
use rank::{Published, RankRun};
use report::{pull_steps, verify_step, write_step, Record};
use scenario::Scenario;
use step::Bound;

/// What the pull gives back: the prefill ranks' handshakes, the seconds encoding them took,
/// each decode rank's run, and the prefill caches (moved into the engines during the pull and
/// taken back for the verification).
pub(crate) struct Pulled {
    pub published: Vec<Published>,
    pub encode_s: f64,
    pub ranks: Vec<RankRun>,
    pub prefill: Vec<Vec<Vec<u8>>>,
}

/// `kvlayout demo --help`'s text after the options: examples, then what the flags mean
/// together, what is verified and the exit status.
pub(crate) const HELP: &str = "Example:
  kvlayout demo
  kvlayout demo --preset qwen2.5-7b --tp 4 --decode \"order=NHD N=32\" --json
  kvlayout demo --prefill-tp 2 --tp 1 --decode \"order=HND N=16 page=139264\" --prompts 1000,3

Each side's SPEC is one rank's cache: modifiers of the preset or a whole SPEC. Modifiers are \
merged key by key, a later key=value replacing an earlier one: the preset's own tokens, then \
L= --layers, B= --blocks and H= the rank's heads, then the modifiers. The prefill side's \
heads and head sizes must be the model's. The plan is direct where both sides have the \
same order and staged otherwise (--plan). Verified: every K/V element on each decode rank \
equals byte for byte the prefill cache's at the same (layer, token, head, dim); the scalar \
reference's decode on each decode rank's cache equals bit for bit its decode on the prefill \
cache for the same query heads; the backend's paged_decode lies within the conformance \
tolerance of the reference. Bounds, checked before anything is allocated: at most 1 GiB \
per rank's cache and 4 GiB held by the whole demo (every rank's cache copies, staging and the \
memcpy bound), and no more than the machine's available memory; at most 2^24 K/V elements \
compared and 2^25 reference products (tokens x layers x query heads x (key + value width)), \
so that a run takes seconds. Steps that move no data (handshake, check, plan, verify) show \
no bandwidth; the others show it as a ratio to `kvlayout bench`'s multi-threaded memcpy \
bound, measured right after the step. Exit status: 0 verified, 1 not verified or the transfer failed, \
2 a bad flag or a refused scenario (the handshake, compatibility check or planner's reason).";

/// What `kvlayout demo` takes. Numbers are read here, so that a bad one is one line.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// The model: a preset (`kvlayout presets`), with overrides if any ("llama-3-8b
    /// dtype=f16"). Its content, head size, dtype and KV heads are what both sides hold.
    #[arg(long, value_name = "PRESET", default_value = "llama-3-8b")]
    pub preset: String,
    /// One prefill rank's cache: modifiers of the preset ("order=NHD N=16": N tokens per
    /// block, order, page= bytes per padded page, ...), to which the demo adds H= the rank's
    /// heads (the model's / --prefill-tp), L= --layers and B= --blocks unless the modifiers
    /// set them; or a whole SPEC, taken as is (its H is one rank's heads).
    #[arg(long, value_name = "SPEC", default_value = "order=NHD N=16")]
    pub prefill: String,
    /// One decode rank's cache, as --prefill ("order=HND N=32 page=69632": head-major
    /// 32-token blocks, each page padded to 69632 bytes, 4 KiB past the dense page of 4 heads).
    #[arg(long, value_name = "SPEC", default_value = "order=HND N=32 page=69632")]
    pub decode: String,
    /// TP size of the prefill side.
    #[arg(
        long = "prefill-tp",
        value_name = "N",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub prefill_tp: String,
    /// TP size of the decode side: each decode rank pulls its share of the heads.
    #[arg(
        long,
        value_name = "N",
        default_value = "2",
        allow_hyphen_values = true
    )]
    pub tp: String,
    /// Layer slots of both sides' caches (the preset's are shrunk to this).
    #[arg(
        long,
        value_name = "L",
        default_value = "2",
        allow_hyphen_values = true
    )]
    pub layers: String,
    /// Blocks in each rank's pool, on both sides (B of the rank's layout).
    #[arg(
        long,
        value_name = "B",
        default_value = "128",
        allow_hyphen_values = true
    )]
    pub blocks: String,
    /// Tokens of each prompt, comma-separated; their blocks are drawn at random from each
    /// side's pool.
    #[arg(
        long,
        value_name = "T,T,...",
        default_value = "509,77,130",
        allow_hyphen_values = true
    )]
    pub prompts: String,
    /// auto (direct where both sides have the same physical order, staged otherwise),
    /// direct (every byte straight into its place) or staged (whole page slices into a
    /// staging cache, then scatter_blocks on the backend).
    #[arg(long, value_name = "HOW", default_value = "auto")]
    pub plan: String,
    /// Backend of write_kv, scatter_blocks and paged_decode (`kvlayout decode --help` lists
    /// the names).
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    pub backend: String,
    /// Transfer engine: memcpy (one process) or nixl (the decode side in a second process,
    /// over NIXL on loopback; exit 2 where the library does not load).
    #[arg(long, value_name = "ENGINE", default_value = "memcpy")]
    pub engine: String,
    /// Seed of the keys, values, queries and block tables.
    #[arg(
        long,
        value_name = "N",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub seed: String,
}

/// Runs the demo and returns its record; a failed verification is the caller's to report.
pub(crate) fn run(a: &DemoArgs) -> Result<Record, CliError> {
    let start = Instant::now();
    let sc = Scenario::from_args(a)?;
    let engine = match a.engine.as_str() {
        "memcpy" | "nixl" => a.engine.clone(),
        other => {
            return Err(CliError::Usage(format!(
                "--engine {other:?}: memcpy or nixl"
            )))
        }
    };
    if engine == "nixl" {
        nixl::available()?;
    }
    budget::check(&sc, engine == "nixl")?;
    let be = crate::common::backend::open(&a.backend, None)?;
    let bound = Bound::new()?;
    let cpu = crate::cpu::CpuReport::of(crate::cpu::features()?).model_name;
    let kernels = be.kernels().build;

    let filled = prefill::prefill(&be, &sc)?;
    let mut steps = vec![write_step(&sc, &be, &filled, &bound)?];
    let pulled = if engine == "nixl" {
        nixl::run(a, &sc, filled.bytes)?
    } else {
        memcpy_run(&be, &sc, filled.bytes)?
    };
    let Pulled {
        published,
        encode_s,
        ranks,
        prefill,
    } = pulled;
    steps.extend(pull_steps(
        &sc, &be, &engine, &published, encode_s, &ranks, &bound,
    )?);
    let t = Instant::now();
    let verification = verify::verify(&be, &sc, &prefill, &ranks)?;
    steps.push(verify_step(&verification, t.elapsed().as_secs_f64()));
    Ok(Record {
        scenario: sc,
        backend: be.name().to_string(),
        kernels,
        engine,
        cpu,
        memcpy_threads: bound.threads(),
        steps,
        verification,
        wall_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// The decode side in this process with the memcpy engine: the prefill ranks' engines (each
/// owning its rank's cache) publish their handshakes, each decode rank pulls.
fn memcpy_run(
    be: &AnyBackend,
    sc: &Scenario,
    prefill: Vec<Vec<Vec<u8>>>,
) -> Result<Pulled, CliError> {
    use kvlayout_connector::engine::{MemcpyEngine, TransferEngine};
    use kvlayout_connector::handshake::{Limits, PeerMetadata};
    let tag = std::process::id();
    let mut engines = Vec::new();
    let mut published = Vec::new();
    let mut encode_s = 0.0;
    for (rank, bytes) in prefill.into_iter().enumerate() {
        let name = format!("demo-{tag}-prefill-{rank}");
        let e = MemcpyEngine::new(&name, bytes)
            .map_err(|e| CliError::Failed(format!("prefill rank {rank}: {e}")))?;
        let meta = PeerMetadata {
            engine_id: name.clone(),
            groups: vec![rank::group(&sc.prefill, rank as u64, e.regions())],
        };
        let t = Instant::now();
        meta.validate(&Limits::default())
            .map_err(|e| CliError::Usage(format!("prefill rank {rank}: handshake: {e}")))?;
        let handshake = meta.encode();
        encode_s += t.elapsed().as_secs_f64();
        published.push(Published {
            handshake,
            engine: e
                .local_metadata()
                .map_err(|e| CliError::Failed(e.to_string()))?,
        });
        engines.push(e);
    }
    let ranks = (0..sc.decode.tp)
        .map(|r| {
            rank::run(be, sc, r, &published, |buffers| {
                MemcpyEngine::new(&format!("demo-{tag}-decode-{r}"), buffers)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Each engine's cache back, one rank at a time (a copy, then the engine is dropped).
    let prefill = engines
        .into_iter()
        .enumerate()
        .map(|(rank, e)| {
            e.buffers()
                .map_err(|e| CliError::Failed(format!("prefill rank {rank}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Pulled {
        published,
        encode_s,
        ranks,
        prefill,
    })
}

/// `kvlayout demo`: runs it and prints the record; a failed verification is exit 1 after the
/// record is printed.
pub(crate) fn command(a: &DemoArgs, as_json: bool) -> Result<String, CliError> {
    let record = run(a)?;
    let text = if as_json {
        crate::json(&record)?
    } else {
        record.to_text()
    };
    if record.verification.passed {
        return Ok(text);
    }
    // The record goes to stdout all the same: it is what shows the disagreement.
    let _ = crate::emit(&text);
    let v = &record.verification;
    Err(CliError::Check(format!(
        "the decode side does not match the prefill side: {} of {} elements differ{}, {} of {} \
         reference outputs differ, backend at {:.2} x its bound",
        v.elements_differing,
        v.elements,
        v.first_difference
            .as_ref()
            .map(|f| format!(" (first: {f})"))
            .unwrap_or_default(),
        v.reference_differing,
        v.reference_outputs,
        v.backend_error_to_bound
    )))
}

/// `kvlayout demo-peer`: the decode side's process of `demo --engine nixl`.
pub(crate) fn peer(a: &PeerArgs) -> Result<String, CliError> {
    nixl::peer(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use kvlayout::{Coord, Field};

    /// The demo's arguments as the command line gives them.
    fn args(flags: &[&str]) -> DemoArgs {
        let argv = ["kvlayout", "demo"].iter().chain(flags).copied();
        match crate::Cli::try_parse_from(argv)
            .expect("the flags parse")
            .command
        {
            crate::Command::Demo { args, .. } => args,
            other => panic!("{other:?}"),
        }
    }

    /// A corrupted byte on a decode rank, or a corrupted output, fails the verification and
    /// names the element; the untouched run passes.
    #[test]
    fn verification_catches_one_corrupted_element_and_one_corrupted_output() {
        let a = args(&["--prompts", "40,23", "--blocks", "8", "--layers", "1"]);
        let sc = Scenario::from_args(&a).unwrap();
        let be = crate::common::backend::open("cpu", None).unwrap();
        let filled = prefill::prefill(&be, &sc).unwrap();
        let Pulled {
            mut ranks, prefill, ..
        } = memcpy_run(&be, &sc, filled.bytes).unwrap();
        let filled = prefill::Prefilled {
            bytes: prefill,
            ..filled
        };
        let v = verify::verify(&be, &sc, &filled.bytes, &ranks).unwrap();
        assert!(v.passed, "{v:?}");
        assert_eq!(v.elements, 63 * 8 * 256);

        // Prompt 1's token 20, rank 1's head 2 (model head 6), V element 5.
        let d = &sc.decode;
        let at = Coord {
            layer: 0,
            block: d.tables[1][(20 / d.block_size) as usize],
            head: 2,
            slot: 20 % d.block_size,
            field: Field::V,
            dim: 5,
        };
        let loc = d.layout.offset(&at).unwrap();
        ranks[1].cache[loc.buffer as usize][loc.offset as usize] ^= 0x40;
        let v = verify::verify(&be, &sc, &filled.bytes, &ranks).unwrap();
        assert!(!v.passed);
        assert_eq!(v.elements_differing, 1);
        let first = v.first_difference.unwrap();
        assert!(
            first.contains("decode rank 1 layer 0 prompt 1 token 20 head 6 v dim 5"),
            "{first}"
        );
        // The reference on the corrupted cache differs from the prefill side's for the query
        // heads of that KV head, on prompt 1 only.
        assert!(v.reference_differing > 0);
        ranks[1].cache[loc.buffer as usize][loc.offset as usize] ^= 0x40;

        ranks[0].outputs[0][7] += 1.0;
        let v = verify::verify(&be, &sc, &filled.bytes, &ranks).unwrap();
        assert!(!v.passed);
        assert_eq!((v.elements_differing, v.reference_differing), (0, 0));
        assert!(v.backend_error_to_bound > 1.0, "{v:?}");
    }
}
