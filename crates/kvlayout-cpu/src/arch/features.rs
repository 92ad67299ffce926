//! The CPU features the kernel builds need, as this process sees them: detected once, minus
//! those `KVLAYOUT_CPU_HIDE` hides. Every part of the crate asks here (the builds a machine
//! runs, the build `auto` picks, the calibration, the bench bounds), so a test or a bench runs
//! as it would on a CPU that lacks them. Hiding only removes: a feature the CPU lacks stays
//! absent whatever the variable says.

use std::sync::OnceLock;

/// The environment variable naming the features to hide, comma-separated (`avx512bf16`,
/// `avx512f`, `avx2`, ...).
pub const HIDE_VAR: &str = "KVLAYOUT_CPU_HIDE";

/// Every feature a build checks, each with the features it needs: hiding one hides those
/// that need it (no CPU has AVX-512 without AVX2, FMA and F16C), so `avx512f` hides every
/// AVX-512 feature and `avx2` every SIMD build. A feature comes after those it needs.
const FEATURES: &[(&str, &[&str])] = &[
    ("avx2", &[]),
    ("fma", &[]),
    ("f16c", &[]),
    ("avx512f", &["avx2", "fma", "f16c"]),
    ("avx512bw", &["avx512f"]),
    ("avx512vl", &["avx512f"]),
    ("avx512bf16", &["avx512f"]),
    ("avx512vbmi", &["avx512f"]),
];

/// The CPU as this process sees it: its identity, the features the kernel builds check that
/// it has, and those of them `KVLAYOUT_CPU_HIDE` hides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuFeatures {
    /// The model name the OS reports (`/proc/cpuinfo`), or `unknown CPU`.
    pub model_name: String,
    /// CPUID's vendor, family and model (`AuthenticAMD family 25 model 1`), where x86_64.
    pub identity: Option<String>,
    /// The features the CPU has, of those a build checks, hidden ones included.
    pub detected: Vec<&'static str>,
    /// Of [`CpuFeatures::detected`], those this process does not use.
    pub hidden: Vec<&'static str>,
    /// The value of `KVLAYOUT_CPU_HIDE`, where set.
    pub hide: Option<String>,
    /// Why that value was refused (an unknown name): nothing is hidden then.
    pub refused: Option<UnknownFeature>,
}

/// A `KVLAYOUT_CPU_HIDE` naming a feature no build checks: the value, the name, and (in its
/// message) the features it may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFeature {
    /// The variable's whole value.
    pub value: String,
    /// The name in it that is no feature.
    pub name: String,
}

impl std::fmt::Display for UnknownFeature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known: Vec<&str> = FEATURES.iter().map(|(name, _)| *name).collect();
        write!(
            f,
            "{HIDE_VAR}={}: no CPU feature {:?} (features: {})",
            self.value,
            self.name,
            known.join(", ")
        )
    }
}

impl std::error::Error for UnknownFeature {}

impl CpuFeatures {
    /// This process's view, read once (the variable is read at the first use). A refused
    /// value hides nothing; the backend's kernel choice says so (and writes it to stderr).
    pub fn get() -> &'static CpuFeatures {
        static FEATURES_SEEN: OnceLock<CpuFeatures> = OnceLock::new();
        FEATURES_SEEN.get_or_init(|| CpuFeatures::of(detected(), std::env::var(HIDE_VAR).ok()))
    }

    /// The view of a CPU with features `detected` under the hide list `hide`.
    fn of(detected: Vec<&'static str>, hide: Option<String>) -> CpuFeatures {
        let (hidden, refused) = match hide.as_deref().map(hidden_by) {
            Some(Ok(h)) => (h, None),
            Some(Err(e)) => (Vec::new(), Some(e)),
            None => (Vec::new(), None),
        };
        CpuFeatures {
            model_name: model_name(),
            identity: identity(),
            hidden: detected
                .iter()
                .copied()
                .filter(|f| hidden.contains(f))
                .collect(),
            detected,
            hide,
            refused,
        }
    }

    /// Whether this process uses the feature `name`: the CPU has it and it is not hidden.
    pub fn has(&self, name: &str) -> bool {
        self.detected.contains(&name) && !self.hidden.contains(&name)
    }

    /// Why the feature `name` is not used: `None` where it is.
    pub(crate) fn missing(&self, name: &str) -> Option<Missing> {
        if self.hidden.contains(&name) {
            Some(Missing::Hidden)
        } else if !self.detected.contains(&name) {
            Some(Missing::Absent)
        } else {
            None
        }
    }

    /// The features this process uses: those detected and not hidden.
    pub fn used(&self) -> Vec<&'static str> {
        self.detected
            .iter()
            .copied()
            .filter(|f| !self.hidden.contains(f))
            .collect()
    }

    /// One line: the CPU, the features used, and those hidden.
    pub fn describe(&self) -> String {
        let used = self.used();
        let mut s = self.model_name.clone();
        if let Some(id) = &self.identity {
            s += &format!(" ({id})");
        }
        s += &format!(
            ": {}",
            if used.is_empty() {
                "no SIMD feature a build checks".to_string()
            } else {
                used.join(" ")
            }
        );
        if !self.hidden.is_empty() {
            s += &format!("; {HIDE_VAR} hides {}", self.hidden.join(" "));
        }
        if let Some(why) = &self.refused {
            s += &format!("; {why}, nothing hidden");
        }
        s
    }
}

/// Why a build cannot use a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// The CPU lacks it.
    Absent,
    /// `KVLAYOUT_CPU_HIDE` hides it.
    Hidden,
}

/// The features `value` hides: those it names and those that need them; an unknown name is
/// refused, naming it and the known ones.
fn hidden_by(value: &str) -> Result<Vec<&'static str>, UnknownFeature> {
    let mut hidden: Vec<&'static str> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match FEATURES.iter().find(|(f, _)| *f == name) {
            Some((f, _)) => hidden.push(f),
            None => {
                return Err(UnknownFeature {
                    value: value.to_string(),
                    name: name.to_string(),
                })
            }
        }
    }
    // One pass suffices: each feature comes after those it needs.
    for (f, needs) in FEATURES {
        if !hidden.contains(f) && needs.iter().any(|n| hidden.contains(n)) {
            hidden.push(f);
        }
    }
    Ok(FEATURES
        .iter()
        .map(|(f, _)| *f)
        .filter(|f| hidden.contains(f))
        .collect())
}

/// The features of [`FEATURES`] the CPU has.
#[cfg(target_arch = "x86_64")]
fn detected() -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    FEATURES
        .iter()
        .map(|(f, _)| *f)
        .filter(|f| match *f {
            "avx2" => has!("avx2"),
            "fma" => has!("fma"),
            "f16c" => has!("f16c"),
            "avx512f" => has!("avx512f"),
            "avx512bw" => has!("avx512bw"),
            "avx512vl" => has!("avx512vl"),
            "avx512bf16" => has!("avx512bf16"),
            "avx512vbmi" => has!("avx512vbmi"),
            _ => false,
        })
        .collect()
}

/// No feature a build checks exists off x86_64.
#[cfg(not(target_arch = "x86_64"))]
fn detected() -> Vec<&'static str> {
    Vec::new()
}

/// The model name `/proc/cpuinfo` gives, or `unknown CPU`.
fn model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// CPUID's vendor string, family and model (leaves 0 and 1).
#[cfg(target_arch = "x86_64")]
fn identity() -> Option<String> {
    // `__cpuid` is safe on newer toolchains, hence `unused_unsafe`.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID is part of x86_64; leaf 1 exists on every x86_64 CPU and only reads
    // identification registers.
    let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
    let base_family = (eax >> 8) & 0xf;
    let base_model = (eax >> 4) & 0xf;
    let (family, model) = match base_family {
        0xf => (
            base_family + ((eax >> 20) & 0xff),
            base_model | (((eax >> 16) & 0xf) << 4),
        ),
        6 => (base_family, base_model | (((eax >> 16) & 0xf) << 4)),
        _ => (base_family, base_model),
    };
    let vendor = cpu_vendor();
    Some(format!(
        "{} family {family} model {model}",
        String::from_utf8_lossy(&vendor)
    ))
}

#[cfg(not(target_arch = "x86_64"))]
fn identity() -> Option<String> {
    None
}

/// The CPU's vendor string (CPUID leaf 0), read once.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_vendor() -> [u8; 12] {
    static VENDOR: std::sync::OnceLock<[u8; 12]> = std::sync::OnceLock::new();
    *VENDOR.get_or_init(|| {
        // `__cpuid` is safe on newer toolchains, hence `unused_unsafe`.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is part of x86_64; leaf 0 exists on every x86_64 CPU and only reads
        // identification registers.
        let id = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut vendor = [0u8; 12];
        for (chunk, reg) in vendor.chunks_mut(4).zip([id.ebx, id.edx, id.ecx]) {
            chunk.copy_from_slice(&reg.to_le_bytes());
        }
        vendor
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZEN4: &[&str] = &[
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512bf16",
        "avx512vbmi",
    ];

    fn seen(cpu: &[&'static str], hide: &str) -> CpuFeatures {
        CpuFeatures::of(cpu.to_vec(), Some(hide.into()))
    }

    #[test]
    fn hiding_a_feature_hides_those_that_need_it() {
        let xeon = seen(ZEN4, "avx512bf16");
        assert_eq!(xeon.hidden, ["avx512bf16"]);
        assert!(xeon.has("avx512f") && !xeon.has("avx512bf16"));
        let zen3 = seen(ZEN4, "avx512f");
        assert_eq!(
            zen3.hidden,
            [
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512bf16",
                "avx512vbmi"
            ]
        );
        assert!(zen3.has("avx2") && zen3.has("fma") && !zen3.has("avx512vl"));
        let none = seen(ZEN4, " avx2 ,, ");
        assert!(!none.has("avx2") && !none.has("avx512f"));
        assert!(none.has("fma"), "fma needs nothing that is hidden");
        assert_eq!(none.missing("avx512bw"), Some(Missing::Hidden));
    }

    #[test]
    fn hiding_never_claims_a_feature() {
        // A CPU with AVX2 only: hiding AVX-512 hides nothing, and nothing appears.
        let zen3 = seen(&["avx2", "fma", "f16c"], "avx512bf16,avx512f");
        assert!(zen3.hidden.is_empty());
        assert_eq!(zen3.detected, ["avx2", "fma", "f16c"]);
        assert_eq!(zen3.missing("avx512f"), Some(Missing::Absent));
        assert!(!zen3.describe().contains("hides"), "{}", zen3.describe());
        let empty = CpuFeatures::of(Vec::new(), None);
        assert!(!empty.has("avx2"));
        assert!(empty.describe().contains("no SIMD feature"));
    }

    #[test]
    fn an_unknown_feature_is_refused_and_nothing_hidden() {
        let typo = seen(ZEN4, "avx512f,avx512bf");
        assert!(typo.hidden.is_empty());
        let refused = typo.refused.clone().expect("refused");
        assert_eq!(
            (refused.value.as_str(), refused.name.as_str()),
            ("avx512f,avx512bf", "avx512bf")
        );
        let why = refused.to_string();
        assert!(why.contains("\"avx512bf\""), "{why}");
        assert!(why.contains("avx512bf16, avx512vbmi"), "{why}");
        assert!(typo.describe().contains("nothing hidden"));
    }

    /// This process's view: what the variable names is hidden (and what it cannot hide is
    /// absent); a value set here is valid, so a test command's pass cannot hide nothing by a
    /// typo.
    #[test]
    fn this_process_honours_the_variable() {
        let me = CpuFeatures::get();
        println!("cpu: {}", me.describe());
        assert_eq!(me.hide, std::env::var(HIDE_VAR).ok());
        assert_eq!(me.refused, None, "{HIDE_VAR} must name known features");
        if let Some(hide) = &me.hide {
            for f in hidden_by(hide).expect("valid") {
                assert!(!me.has(f), "{f} is hidden");
            }
        }
        assert!(me.hidden.iter().all(|f| me.detected.contains(f)));
    }
}
