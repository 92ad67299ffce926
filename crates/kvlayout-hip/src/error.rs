//! [`HipError`], what every fallible call of this crate returns, and [`HipCallError`], one
//! failed HIP runtime call with the runtime's name and description of its error.

/// One HIP runtime call that returned an error: the call, the `hipError_t` code and what
/// `hipGetErrorName` and `hipGetErrorString` say of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {name}{}", description_after(.name, .description))]
pub struct HipCallError {
    /// The runtime function, e.g. `"hipModuleLoadData"`.
    pub call: &'static str,
    /// The `hipError_t` value.
    pub code: i32,
    /// `hipGetErrorName`, e.g. `"hipErrorNoBinaryForGpu"`.
    pub name: String,
    /// `hipGetErrorString`.
    pub description: String,
}

/// An embedded code object the runtime refused to load on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObjectRefusal {
    /// The code object's target, e.g. `"gfx90a"`.
    pub arch: &'static str,
    /// The call that refused it.
    pub error: HipCallError,
}

/// What goes wrong on the HIP backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HipError {
    /// No usable device `ordinal`: the runtime found none, failed to start, or has fewer.
    #[error("no HIP device {ordinal} ({count} visible): {why}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the runtime reported (0 when it could not count them).
        count: u32,
        /// The runtime's reason: the failed calls with their errors, or the count.
        why: String,
    },
    /// The crate was built without code objects (no clang-19 at build time).
    #[error("no HIP code objects are embedded in this build: {why}")]
    NoCodeObjects {
        /// What the build script found.
        why: &'static str,
    },
    /// Every embedded code object was refused by the runtime on this device.
    #[error("no embedded code object loads on HIP device {ordinal}: {}", refusal_list(.refusals))]
    NoLoadableCodeObject {
        /// The device.
        ordinal: usize,
        /// Each code object tried, with the runtime's refusal.
        refusals: Vec<CodeObjectRefusal>,
    },
    /// An embedded code object is not a complete AMDGPU ELF (a build problem); nothing was
    /// handed to the runtime.
    #[error("embedded {arch} code object is not a complete AMDGPU ELF: {why}")]
    BadCodeObject {
        /// The code object's target.
        arch: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An argument block whose length is not the kernel's explicit arguments'; nothing was
    /// enqueued.
    #[error("{kernel}: argument block of {len} bytes, the kernel's arguments take {expected}")]
    ArgumentBlock {
        /// The entry point.
        kernel: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes of the explicit arguments (`kvlayout_device::kernels::arg_slots`).
        expected: usize,
    },
    /// A runtime call failed.
    #[error(transparent)]
    Call(#[from] HipCallError),
    /// A copy that would reach past the end of a buffer; nothing was enqueued.
    #[error("{op}: bytes {offset}..{offset}+{len} reach past the buffer's {buffer_len} bytes")]
    OutOfRange {
        /// `upload`, `download` or `copy`.
        op: &'static str,
        /// First byte of the range in the buffer.
        offset: u64,
        /// Bytes of the range.
        len: u64,
        /// Bytes of the buffer.
        buffer_len: u64,
    },
    /// A size this host cannot address (`len + misalign` past `usize`).
    #[error("{what} of {bytes} bytes (+{extra}) exceeds this host's address space")]
    TooLarge {
        /// What was asked for.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
        /// Bytes added to them (the misalignment).
        extra: u64,
    },
}

/// ` (description)`, or nothing where the runtime's description only repeats the name (as
/// ROCm 5.2's does).
fn description_after(name: &str, description: &str) -> String {
    if description.is_empty() || description == name {
        String::new()
    } else {
        format!(" ({description})")
    }
}

fn refusal_list(refusals: &[CodeObjectRefusal]) -> String {
    refusals
        .iter()
        .map(|r| format!("{}: {}", r.arch, r.error))
        .collect::<Vec<_>>()
        .join("; ")
}
