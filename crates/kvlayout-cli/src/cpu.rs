//! `kvlayout cpu`: the CPU as the backend sees it (features used and hidden, the kernel
//! builds it runs and the one it picks, the prefetch level, the threads), and the part of it
//! the decode report carries. Every figure comes from `kvlayout-cpu`.

use serde::Serialize;

use kvlayout_cpu::{CpuBackend, CpuFeatures, CPU_HIDE_VAR};

use crate::CliError;

/// The CPU features this process uses; a `KVLAYOUT_CPU_HIDE` naming an unknown feature is a
/// user error (the library would hide nothing and run on).
pub(crate) fn features() -> Result<&'static CpuFeatures, CliError> {
    let cpu = CpuFeatures::get();
    match &cpu.refused {
        Some(why) => Err(CliError::Usage(why.to_string())),
        None => Ok(cpu),
    }
}

/// The CPU as a report states it.
#[derive(Debug, Serialize)]
pub(crate) struct CpuReport {
    /// The OS's model name.
    pub model_name: String,
    /// CPUID's vendor, family and model, where x86_64.
    pub identity: Option<String>,
    /// The features the kernel builds check that the CPU has, hidden ones included.
    pub detected: Vec<&'static str>,
    /// Those of them `KVLAYOUT_CPU_HIDE` hides from the backend.
    pub hidden: Vec<&'static str>,
    /// The variable's value, where set.
    pub cpu_hide: Option<String>,
    /// All of it in one line, for the text report.
    #[serde(skip)]
    pub summary: String,
}

impl CpuReport {
    pub(crate) fn of(cpu: &CpuFeatures) -> Self {
        CpuReport {
            model_name: cpu.model_name.clone(),
            identity: cpu.identity.clone(),
            detected: cpu.detected.clone(),
            hidden: cpu.hidden.clone(),
            cpu_hide: cpu.hide.clone(),
            summary: cpu.describe(),
        }
    }
}

/// A kernel build this machine does not run, and why.
#[derive(Debug, Serialize)]
struct NotRun {
    build: &'static str,
    why: String,
}

/// What `kvlayout cpu` prints.
#[derive(Debug, Serialize)]
struct CpuCommandReport {
    #[serde(flatten)]
    cpu: CpuReport,
    /// The build the backend runs unless one is named, and why.
    kernels: &'static str,
    kernels_why: String,
    /// Every build this process runs, the picked one first.
    builds: Vec<&'static str>,
    builds_not_run: Vec<NotRun>,
    prefetch_level: String,
    threads: usize,
}

/// `kvlayout cpu`: text or JSON.
pub(crate) fn run(as_json: bool) -> Result<String, CliError> {
    let cpu = features()?;
    let be = CpuBackend::new(None);
    let r = CpuCommandReport {
        cpu: CpuReport::of(cpu),
        kernels: be.kernel_build(),
        kernels_why: be.kernel_choice().to_string(),
        builds: CpuBackend::kernel_builds(),
        builds_not_run: CpuBackend::kernels_not_run()
            .into_iter()
            .map(|(build, why)| NotRun { build, why })
            .collect(),
        prefetch_level: format!("{:?}", be.prefetch_level()),
        threads: be.threads(),
    };
    if as_json {
        return crate::json(&r);
    }
    let hidden = match (&cpu.hide, cpu.hidden.is_empty()) {
        (None, _) => "none".to_string(),
        (Some(v), true) => format!("none ({CPU_HIDE_VAR}={v}: the CPU lacks them already)"),
        (Some(v), false) => format!("{} ({CPU_HIDE_VAR}={v})", cpu.hidden.join(" ")),
    };
    let used = cpu.used();
    let mut out = format!(
        "cpu      {}{}\nfeatures {}\nhidden   {hidden}\nkernels  {}: {}\nbuilds   {}\n",
        cpu.model_name,
        cpu.identity
            .as_ref()
            .map(|id| format!(" ({id})"))
            .unwrap_or_default(),
        if used.is_empty() {
            "none a kernel build checks".to_string()
        } else {
            used.join(" ")
        },
        r.kernels,
        r.kernels_why,
        r.builds.join(", "),
    );
    for n in &r.builds_not_run {
        out += &format!("not run  {}: {}\n", n.build, n.why);
    }
    out += &format!("prefetch {}\nthreads  {}\n", r.prefetch_level, r.threads);
    Ok(out)
}
