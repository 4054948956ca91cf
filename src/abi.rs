//! The launch contract shared with `kernels/prepare_abi.cuh`: the one parameter every custom
//! kernel takes, the limits it is written for, and the words of the signal and state memory.
//! A leaf: it names nothing else in the crate, so the ladder rules, the GPU layer and the
//! runtime can all check against it.

/// Mirror of `struct AllReduceParams` in `kernels/prepare_abi.cuh`; passed by value as the
/// kernel's only argument.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllReduceParams {
    /// Rank r's registered buffer mapped into this process.
    pub buffers: [u64; MAX_RANKS],
    /// Rank r's signal flags mapped into this process.
    pub signals: [u64; MAX_RANKS],
    /// This rank's state words.
    pub state: u64,
    /// Where the sum goes: local memory, `input` itself allowed (see the kernels' headers for
    /// which kernels allow it in a registered buffer).
    pub output: u64,
    /// This rank's message as the kernels that read it only locally see it: any local memory.
    /// Kernels whose peers read the message read `buffers[rank]` instead.
    pub input: u64,
    /// Elements in the message.
    pub elements: u64,
    /// Byte offset of the scratch region in every buffer; at least `elements` x the element size.
    pub scratch_offset: u64,
    /// Deadline for every spin, nanoseconds from the kernel's start.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks taking part.
    pub world: u32,
}

/// Ranks a kernel supports.
pub const MAX_RANKS: usize = 8;
/// Blocks a kernel may launch.
pub const MAX_BLOCKS: usize = 1024;
/// Flag sets per rank: the barriers' and the double-buffered kernels' step flags (two sets: a
/// second phase has its own).
pub const SIGNAL_SETS: usize = 6;
/// 64-bit signal words per rank.
pub const SIGNAL_WORDS: usize = SIGNAL_SETS * MAX_RANKS * MAX_BLOCKS;
/// Bytes of signal flags per rank (peer-mapped, like the buffer).
pub const SIGNAL_BYTES: u64 = SIGNAL_WORDS as u64 * 8;
/// 64-bit state words per rank: the abort word, the blocks' epochs, the double-buffered
/// kernels' launch count, one copy per block number, and the blocks' arrivals.
pub const STATE_WORDS: usize = 1 + 3 * MAX_BLOCKS;
/// The first arrival word: `state[STATE_ARRIVAL_WORDS + b]` holds when block `b` last began a
/// launch past the launch checks (`%globaltimer`, nanoseconds), so a wait that passed its
/// deadline while some block had not started yet (blocks that were not all resident at once)
/// can be told from a kernel's failure.
pub const STATE_ARRIVAL_WORDS: usize = 1 + 2 * MAX_BLOCKS;
/// Set in the abort word when a kernel gave up.
pub const ABORT_FLAG: u64 = 1 << 63;
/// Abort reason: a peer did not arrive before the deadline (the low 32 bits name the peer).
pub const ABORT_PEER_TIMEOUT: u64 = 1;
/// Abort reason: the parameters or geometry break the contract (the low bits name this rank).
pub const ABORT_INVALID_LAUNCH: u64 = 2;
/// Every pointer in [`AllReduceParams`] and its `scratch_offset` are multiples of this.
pub const ALIGNMENT_BYTES: u64 = 16;
/// Lanes of the fused epilogue's sum of squares: lane `l` sums the squares of a row's elements
/// `l, l + NORM_LANES, ...` in order, then a pairwise tree joins the lanes
/// (`prepare::reference::epilogue`). 256 threads of one 16-byte bf16 vector each.
pub const NORM_LANES: usize = 2048;
/// The input region and the whole buffer are rounded up to this, so scratch starts on a fresh
/// line.
pub const BUFFER_ALIGNMENT_BYTES: u64 = 256;

/// Bytes of [`AllReduceParams`], the size every kernel's one parameter has.
pub const PARAMS_BYTES: usize = std::mem::size_of::<AllReduceParams>();

impl AllReduceParams {
    /// The parameter as a launch passes it: the C struct's bytes, field by field in its order,
    /// in this machine's byte order (the struct has no padding).
    pub fn to_bytes(&self) -> [u8; PARAMS_BYTES] {
        let mut bytes = [0_u8; PARAMS_BYTES];
        let scalars = [
            self.state,
            self.output,
            self.input,
            self.elements,
            self.scratch_offset,
            self.timeout_ns,
        ];
        let words = self.buffers.iter().chain(&self.signals).chain(&scalars);
        let mut at = 0;
        for word in words {
            bytes[at..at + 8].copy_from_slice(&word.to_ne_bytes());
            at += 8;
        }
        for half in [self.rank, self.world] {
            bytes[at..at + 4].copy_from_slice(&half.to_ne_bytes());
            at += 4;
        }
        assert_eq!(at, PARAMS_BYTES, "every field is written once");
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::mem::offset_of;

    #[test]
    fn the_bytes_hold_every_field_at_its_offset() {
        let params = AllReduceParams {
            buffers: std::array::from_fn(|rank| 0x1000 + rank as u64),
            signals: std::array::from_fn(|rank| 0x2000 + rank as u64),
            state: 0x3000,
            output: 0x4000,
            input: 0x5000,
            elements: 6,
            scratch_offset: 7,
            timeout_ns: 8,
            rank: 9,
            world: 10,
        };
        let bytes = params.to_bytes();
        let word =
            |offset: usize| u64::from_ne_bytes(bytes[offset..offset + 8].try_into().unwrap());
        let half =
            |offset: usize| u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap());
        for rank in 0..MAX_RANKS {
            assert_eq!(
                word(offset_of!(AllReduceParams, buffers) + 8 * rank),
                params.buffers[rank]
            );
            assert_eq!(
                word(offset_of!(AllReduceParams, signals) + 8 * rank),
                params.signals[rank]
            );
        }
        assert_eq!(word(offset_of!(AllReduceParams, state)), params.state);
        assert_eq!(word(offset_of!(AllReduceParams, output)), params.output);
        assert_eq!(word(offset_of!(AllReduceParams, input)), params.input);
        assert_eq!(word(offset_of!(AllReduceParams, elements)), params.elements);
        assert_eq!(
            word(offset_of!(AllReduceParams, scratch_offset)),
            params.scratch_offset
        );
        assert_eq!(
            word(offset_of!(AllReduceParams, timeout_ns)),
            params.timeout_ns
        );
        assert_eq!(half(offset_of!(AllReduceParams, rank)), params.rank);
        assert_eq!(half(offset_of!(AllReduceParams, world)), params.world);
    }

    /// `#define NAME VALUE` lines of the contract header, values as written.
    fn header_defines() -> BTreeMap<String, String> {
        include_str!("../kernels/prepare_abi.cuh")
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("#define ")?.split_whitespace();
                Some((
                    words.next()?.to_owned(),
                    words.collect::<Vec<_>>().join(" "),
                ))
            })
            .collect()
    }

    fn define_value(defines: &BTreeMap<String, String>, name: &str) -> u64 {
        let text = defines
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let digits = text.trim_end_matches("ull");
        if let Some(hex) = digits.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).unwrap()
        } else {
            digits.parse().unwrap()
        }
    }

    #[test]
    fn constants_match_the_contract_header() {
        let defines = header_defines();
        assert_eq!(
            define_value(&defines, "PREPARE_MAX_RANKS"),
            MAX_RANKS as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_MAX_BLOCKS"),
            MAX_BLOCKS as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_SIGNAL_SETS"),
            SIGNAL_SETS as u64
        );
        assert_eq!(define_value(&defines, "PREPARE_ABORT_FLAG"), ABORT_FLAG);
        assert_eq!(
            define_value(&defines, "PREPARE_ABORT_PEER_TIMEOUT"),
            ABORT_PEER_TIMEOUT
        );
        assert_eq!(
            define_value(&defines, "PREPARE_ABORT_INVALID_LAUNCH"),
            ABORT_INVALID_LAUNCH
        );
        assert_eq!(
            define_value(&defines, "PREPARE_ALIGNMENT_BYTES"),
            ALIGNMENT_BYTES
        );
        assert_eq!(
            define_value(&defines, "PREPARE_NORM_LANES"),
            NORM_LANES as u64
        );
        assert_eq!(
            defines["PREPARE_SIGNAL_WORDS"],
            "(PREPARE_SIGNAL_SETS * PREPARE_MAX_RANKS * PREPARE_MAX_BLOCKS)"
        );
        assert_eq!(
            defines["PREPARE_STATE_WORDS"],
            "(1 + 3 * PREPARE_MAX_BLOCKS)"
        );
        assert_eq!(
            defines["PREPARE_STATE_ARRIVAL_WORDS"],
            "(1 + 2 * PREPARE_MAX_BLOCKS)"
        );
        assert_eq!(STATE_ARRIVAL_WORDS, 1 + 2 * MAX_BLOCKS);
        assert_eq!(STATE_WORDS, STATE_ARRIVAL_WORDS + MAX_BLOCKS);
    }

    #[test]
    fn params_fields_match_the_contract_header_in_order() {
        let header = include_str!("../kernels/prepare_abi.cuh");
        let body = &header[header.find("struct AllReduceParams {").unwrap()..];
        let body = &body[..body.find("};").unwrap()];
        let fields: Vec<String> = body
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with("//") && line.ends_with(';'))
            .map(|line| line.trim_end_matches(';').to_owned())
            .collect();
        assert_eq!(
            fields,
            [
                "unsigned char* buffers[PREPARE_MAX_RANKS]",
                "unsigned long long* signals[PREPARE_MAX_RANKS]",
                "unsigned long long* state",
                "void* output",
                "const unsigned char* input",
                "unsigned long long elements",
                "unsigned long long scratch_offset",
                "unsigned long long timeout_ns",
                "unsigned int rank",
                "unsigned int world",
            ]
        );
        // Those C fields on a 64-bit target: 8-byte pointers and u64, 4-byte u32, no padding.
        assert_eq!(std::mem::size_of::<AllReduceParams>(), 184);
        assert_eq!(std::mem::align_of::<AllReduceParams>(), 8);
        assert_eq!(std::mem::offset_of!(AllReduceParams, signals), 64);
        assert_eq!(std::mem::offset_of!(AllReduceParams, state), 128);
        assert_eq!(std::mem::offset_of!(AllReduceParams, output), 136);
        assert_eq!(std::mem::offset_of!(AllReduceParams, input), 144);
        assert_eq!(std::mem::offset_of!(AllReduceParams, elements), 152);
        assert_eq!(std::mem::offset_of!(AllReduceParams, scratch_offset), 160);
        assert_eq!(std::mem::offset_of!(AllReduceParams, timeout_ns), 168);
        assert_eq!(std::mem::offset_of!(AllReduceParams, rank), 176);
        assert_eq!(std::mem::offset_of!(AllReduceParams, world), 180);
    }
}
