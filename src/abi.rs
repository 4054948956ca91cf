//! The launch contract shared with `kernels/prepare_abi.cuh`: the one parameter every custom
//! kernel takes, the limits it is written for, and the words of the signal and state memory.
//! A leaf: it names nothing else in the crate, so the ladder rules, the GPU layer and the
//! runtime can all check against it.

/// Mirror of `struct LaunchParams` in `kernels/prepare_abi.cuh`, the one parameter of every
/// kernel of every collective, passed by value. A message is `rows` x `width` elements; which
/// fields each collective reads is the header's table. The all-reduce's are
/// [`LaunchParams::all_reduce`]'s.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchParams {
    /// Rank r's registered buffer mapped into this process.
    pub buffers: [u64; MAX_RANKS],
    /// Rank r's signal flags mapped into this process.
    pub signals: [u64; MAX_RANKS],
    /// This rank's state words.
    pub state: u64,
    /// Where the result goes: local memory, `input` itself allowed (see the kernels' headers
    /// for which kernels allow it in a registered buffer).
    pub output: u64,
    /// This rank's message as the kernels that read it only locally see it: any local memory.
    /// Kernels whose peers read the message read `buffers[rank]` instead.
    pub input: u64,
    /// Elements of this rank's input.
    pub input_elements: u64,
    /// Byte offset of the scratch region in every buffer; at least `input_elements` x the
    /// element size.
    pub scratch_offset: u64,
    /// Deadline for every spin, nanoseconds from the kernel's start.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks taking part.
    pub world: u32,
    /// Elements of this rank's output.
    pub output_elements: u64,
    /// Rows of the message (an all-reduce's: 1, unread by its kernels).
    pub rows: u64,
    /// Elements of a row (an all-reduce's: the message's count, unread by its kernels).
    pub width: u64,
    /// The fused epilogue's residual, added to the sum (0 for every other collective).
    pub residual: u64,
    /// The fused epilogue's RMSNorm weight, `width` elements (0 for every other collective).
    pub weight: u64,
    /// Where the fused epilogue's normalised rows go (0 for every other collective).
    pub normed: u64,
    /// The fused epilogue's RMSNorm epsilon (0 for every other collective).
    pub eps: f32,
    /// Always 0: the struct's tail, explicit so that it has no implicit padding.
    pub padding: u32,
}

/// Ranks a kernel supports.
pub const MAX_RANKS: usize = 8;
/// Blocks a kernel may launch.
pub const MAX_BLOCKS: usize = 1024;
/// Flag sets per rank: the barriers' and the double-buffered kernels' step flags (two sets: a
/// second phase has its own), two sets that together hold the shape lines, then four that hold
/// the double-buffered kernels' shape lines (two per parity).
pub const SIGNAL_SETS: usize = 12;
/// The first set of the shape lines: from word `SHAPE_SET * MAX_RANKS * MAX_BLOCKS` of a rank's
/// signals, two words per (source rank, block), `2 * (source * MAX_BLOCKS + block)` on, that
/// source's shape as its start barrier last sent it (see [`ABORT_SHAPE_MISMATCH`]).
pub const SHAPE_SET: usize = 6;
/// The first set of the double-buffered kernels' shape lines: from word
/// `LINE_SHAPE_SET * MAX_RANKS * MAX_BLOCKS`, two words per (parity, source rank, block),
/// `2 * ((parity * MAX_RANKS + source) * MAX_BLOCKS + block)` on: the source's element count and
/// rows in its launch of that parity, each beside the launch's line flag.
pub const LINE_SHAPE_SET: usize = 8;
/// Bits of a shape word that carry its count (the element count, the rows); those above are the
/// tag of the launch's epoch.
pub const SHAPE_BITS: u32 = 48;
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
/// Abort reason: a peer's launch of the same message has another shape, its element count (the
/// larger side) or its rows (the low bits name that peer); the start barrier found it before
/// anything was read or written.
pub const ABORT_SHAPE_MISMATCH: u64 = 3;
/// Every pointer in [`LaunchParams`] and its `scratch_offset` are multiples of this.
pub const ALIGNMENT_BYTES: u64 = 16;
/// Lanes of the fused epilogue's sum of squares: lane `l` sums the squares of a row's elements
/// `l, l + NORM_LANES, ...` in order, then a pairwise tree joins the lanes
/// (`prepare::reference::epilogue`). 256 threads of one 16-byte bf16 vector each.
pub const NORM_LANES: usize = 2048;
/// The input region and the whole buffer are rounded up to this, so scratch starts on a fresh
/// line.
pub const BUFFER_ALIGNMENT_BYTES: u64 = 256;

/// Bytes of [`LaunchParams`], the size every kernel's one parameter has.
pub const PARAMS_BYTES: usize = std::mem::size_of::<LaunchParams>();

impl LaunchParams {
    /// The parameter of an all-reduce of `elements` ([`Self::set_all_reduce_elements`]), with
    /// no epilogue, and every pointer, offset, the deadline, the rank and the world 0, for the
    /// caller to fill in (`LaunchParams { buffers, .., ..LaunchParams::all_reduce(elements) }`).
    pub fn all_reduce(elements: u64) -> Self {
        let mut params = Self {
            buffers: [0; MAX_RANKS],
            signals: [0; MAX_RANKS],
            state: 0,
            output: 0,
            input: 0,
            input_elements: 0,
            scratch_offset: 0,
            timeout_ns: 0,
            rank: 0,
            world: 0,
            output_elements: 0,
            rows: 0,
            width: 0,
            residual: 0,
            weight: 0,
            normed: 0,
            eps: 0.0,
            padding: 0,
        };
        params.set_all_reduce_elements(elements);
        params
    }

    /// Makes the message an all-reduce's of `elements`: that many in and out, one row of them.
    pub fn set_all_reduce_elements(&mut self, elements: u64) {
        self.input_elements = elements;
        self.output_elements = elements;
        self.rows = 1;
        self.width = elements;
    }

    /// The parameter as a launch passes it: the C struct's bytes, field by field in its order,
    /// in this machine's byte order (the struct has no padding).
    pub fn to_bytes(&self) -> [u8; PARAMS_BYTES] {
        fn put(bytes: &mut [u8], at: &mut usize, field: &[u8]) {
            bytes[*at..*at + field.len()].copy_from_slice(field);
            *at += field.len();
        }
        let mut bytes = [0_u8; PARAMS_BYTES];
        let mut at = 0;
        let scalars = [
            self.state,
            self.output,
            self.input,
            self.input_elements,
            self.scratch_offset,
            self.timeout_ns,
        ];
        for word in self.buffers.iter().chain(&self.signals).chain(&scalars) {
            put(&mut bytes, &mut at, &word.to_ne_bytes());
        }
        put(&mut bytes, &mut at, &self.rank.to_ne_bytes());
        put(&mut bytes, &mut at, &self.world.to_ne_bytes());
        let shape_and_epilogue = [
            self.output_elements,
            self.rows,
            self.width,
            self.residual,
            self.weight,
            self.normed,
        ];
        for word in shape_and_epilogue {
            put(&mut bytes, &mut at, &word.to_ne_bytes());
        }
        put(&mut bytes, &mut at, &self.eps.to_ne_bytes());
        put(&mut bytes, &mut at, &self.padding.to_ne_bytes());
        assert_eq!(at, PARAMS_BYTES, "every field is written once");
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::mem::offset_of;

    /// Every field a distinct value, so a field written at another's place shows.
    fn distinct() -> LaunchParams {
        LaunchParams {
            buffers: std::array::from_fn(|rank| 0x1000 + rank as u64),
            signals: std::array::from_fn(|rank| 0x2000 + rank as u64),
            state: 0x3000,
            output: 0x4000,
            input: 0x5000,
            input_elements: 6,
            scratch_offset: 7,
            timeout_ns: 8,
            rank: 9,
            world: 10,
            output_elements: 11,
            rows: 12,
            width: 13,
            residual: 0x6000,
            weight: 0x7000,
            normed: 0x8000,
            eps: 1.5e-6,
            padding: 14,
        }
    }

    #[test]
    fn the_bytes_hold_every_field_at_its_offset() {
        let params = distinct();
        let bytes = params.to_bytes();
        let word =
            |offset: usize| u64::from_ne_bytes(bytes[offset..offset + 8].try_into().unwrap());
        let half =
            |offset: usize| u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap());
        for rank in 0..MAX_RANKS {
            assert_eq!(
                word(offset_of!(LaunchParams, buffers) + 8 * rank),
                params.buffers[rank]
            );
            assert_eq!(
                word(offset_of!(LaunchParams, signals) + 8 * rank),
                params.signals[rank]
            );
        }
        let words = [
            (offset_of!(LaunchParams, state), params.state),
            (offset_of!(LaunchParams, output), params.output),
            (offset_of!(LaunchParams, input), params.input),
            (
                offset_of!(LaunchParams, input_elements),
                params.input_elements,
            ),
            (
                offset_of!(LaunchParams, scratch_offset),
                params.scratch_offset,
            ),
            (offset_of!(LaunchParams, timeout_ns), params.timeout_ns),
            (
                offset_of!(LaunchParams, output_elements),
                params.output_elements,
            ),
            (offset_of!(LaunchParams, rows), params.rows),
            (offset_of!(LaunchParams, width), params.width),
            (offset_of!(LaunchParams, residual), params.residual),
            (offset_of!(LaunchParams, weight), params.weight),
            (offset_of!(LaunchParams, normed), params.normed),
        ];
        for (offset, value) in words {
            assert_eq!(word(offset), value, "the word at {offset}");
        }
        assert_eq!(half(offset_of!(LaunchParams, rank)), params.rank);
        assert_eq!(half(offset_of!(LaunchParams, world)), params.world);
        assert_eq!(half(offset_of!(LaunchParams, eps)), params.eps.to_bits());
        assert_eq!(half(offset_of!(LaunchParams, padding)), params.padding);
    }

    #[test]
    fn an_all_reduce_is_one_row_of_its_elements_with_no_epilogue() {
        let params = LaunchParams::all_reduce(1001);
        assert_eq!(
            (
                params.input_elements,
                params.output_elements,
                params.rows,
                params.width
            ),
            (1001, 1001, 1, 1001)
        );
        assert_eq!((params.residual, params.weight, params.normed), (0, 0, 0));
        assert_eq!((params.eps.to_bits(), params.padding), (0, 0));
        let mut chunk = params;
        chunk.set_all_reduce_elements(8);
        assert_eq!(
            (
                chunk.input_elements,
                chunk.output_elements,
                chunk.rows,
                chunk.width
            ),
            (8, 8, 1, 8)
        );
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
            define_value(&defines, "PREPARE_ABORT_SHAPE_MISMATCH"),
            ABORT_SHAPE_MISMATCH
        );
        assert_eq!(
            define_value(&defines, "PREPARE_SHAPE_SET"),
            SHAPE_SET as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_LINE_SHAPE_SET"),
            LINE_SHAPE_SET as u64
        );
        assert_eq!(
            define_value(&defines, "PREPARE_SHAPE_BITS"),
            u64::from(SHAPE_BITS)
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
        // The shape lines take the last sets: two for the start barrier's, then two per parity.
        assert_eq!(SHAPE_SET + 2, LINE_SHAPE_SET);
        assert_eq!(LINE_SHAPE_SET + 4, SIGNAL_SETS);
        assert_eq!(STATE_ARRIVAL_WORDS, 1 + 2 * MAX_BLOCKS);
        assert_eq!(STATE_WORDS, STATE_ARRIVAL_WORDS + MAX_BLOCKS);
    }

    #[test]
    fn params_fields_match_the_contract_header_in_order() {
        let header = include_str!("../kernels/prepare_abi.cuh");
        let body = &header[header.find("struct LaunchParams {").unwrap()..];
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
                "unsigned long long input_elements",
                "unsigned long long scratch_offset",
                "unsigned long long timeout_ns",
                "unsigned int rank",
                "unsigned int world",
                "unsigned long long output_elements",
                "unsigned long long rows",
                "unsigned long long width",
                "void* residual",
                "const void* weight",
                "void* normed",
                "float eps",
                "unsigned int padding",
            ]
        );
        // Those C fields on a 64-bit target: 8-byte pointers and u64, 4-byte u32 and float,
        // no implicit padding. The all-reduce's fields keep the offsets they had before the
        // shape and the epilogue were added.
        assert_eq!(std::mem::size_of::<LaunchParams>(), 240);
        assert_eq!(std::mem::align_of::<LaunchParams>(), 8);
        let offsets = [
            (offset_of!(LaunchParams, buffers), 0),
            (offset_of!(LaunchParams, signals), 64),
            (offset_of!(LaunchParams, state), 128),
            (offset_of!(LaunchParams, output), 136),
            (offset_of!(LaunchParams, input), 144),
            (offset_of!(LaunchParams, input_elements), 152),
            (offset_of!(LaunchParams, scratch_offset), 160),
            (offset_of!(LaunchParams, timeout_ns), 168),
            (offset_of!(LaunchParams, rank), 176),
            (offset_of!(LaunchParams, world), 180),
            (offset_of!(LaunchParams, output_elements), 184),
            (offset_of!(LaunchParams, rows), 192),
            (offset_of!(LaunchParams, width), 200),
            (offset_of!(LaunchParams, residual), 208),
            (offset_of!(LaunchParams, weight), 216),
            (offset_of!(LaunchParams, normed), 224),
            (offset_of!(LaunchParams, eps), 232),
            (offset_of!(LaunchParams, padding), 236),
        ];
        for (found, expected) in offsets {
            assert_eq!(found, expected);
        }
        assert_eq!(PARAMS_BYTES, 240);
    }
}
