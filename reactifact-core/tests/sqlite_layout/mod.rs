//! The bytes of a SQLite database file, sorted by what SQLite does with them (after the file
//! format, <https://www.sqlite.org/fileformat2.html>), for a test that damages a file byte by
//! byte: the structure SQLite interprets, the space it never reads, and the records' content.

use std::collections::BTreeSet;
use std::ops::Range;

/// Every byte of a database file, in one of three classes.
#[derive(Debug, Default)]
pub struct Layout {
    /// Offsets of the bytes SQLite interprets as structure: the database header, each b-tree
    /// page's header and cell pointer array, each cell's child pointer, sizes, row id, record
    /// header and overflow pointer, each freeblock's header, each overflow page's next
    /// pointer, each freelist trunk page's header and leaf pointers.
    pub structure: BTreeSet<usize>,
    /// Per page, the ranges SQLite never reads: a b-tree page's unallocated space (between
    /// its cell pointer array and its cell content area), its freeblocks past their headers
    /// and its reserved tail; a freelist leaf page, and the unused tail of the last page of
    /// an overflow chain.
    pub unused: Vec<(u32, Vec<Range<usize>>)>,
    /// The pages of each kind, to check that the file has the shape the test means.
    pub btree_pages: usize,
    /// Overflow pages (parts of records too long for their b-tree page).
    pub overflow_pages: usize,
    /// Freelist pages, trunk and leaf.
    pub freelist_pages: usize,
}

impl Layout {
    /// The record content: every byte in neither `structure` nor `unused`.
    pub fn content(&self, len: usize) -> Vec<usize> {
        let unused: BTreeSet<usize> = self
            .unused
            .iter()
            .flat_map(|(_, ranges)| ranges.iter().cloned().flatten())
            .collect();
        (0..len)
            .filter(|at| !self.structure.contains(at) && !unused.contains(at))
            .collect()
    }
}

fn u16_at(bytes: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A SQLite varint at `at`: its value and its length (1 to 9 bytes).
fn varint(bytes: &[u8], at: usize) -> (u64, usize) {
    let mut value = 0u64;
    for i in 0..8 {
        let byte = bytes[at + i];
        value = (value << 7) | u64::from(byte & 0x7f);
        if byte & 0x80 == 0 {
            return (value, i + 1);
        }
    }
    ((value << 8) | u64::from(bytes[at + 8]), 9)
}

/// Sorts every byte of `file`, an intact database without a WAL (no pointer-map pages: not
/// auto-vacuumed). Panics on a page it cannot place, so that the test never flips bytes it
/// misclassified.
pub fn layout(file: &[u8]) -> Layout {
    assert_eq!(&file[..16], b"SQLite format 3\0", "a SQLite database");
    let page_size = match u16_at(file, 16) {
        1 => 65_536,
        n => n,
    };
    let reserved = usize::from(file[20]);
    let usable = page_size - reserved;
    let pages = file.len() / page_size;
    assert_eq!(file.len(), pages * page_size, "whole pages");
    assert_eq!(u32_at(file, 52), 0, "no pointer-map pages (auto-vacuum off)");
    let page = |number: u32| {
        let start = (number as usize - 1) * page_size;
        start..start + page_size
    };
    let mut layout = Layout::default();
    layout.structure.extend(0..100);
    let mut placed: BTreeSet<u32> = BTreeSet::new();

    // The freelist: trunk pages (next trunk, leaf count, leaf page numbers), and leaf pages,
    // which SQLite never reads.
    let mut trunk = u32_at(file, 32);
    while trunk != 0 {
        let at = page(trunk).start;
        let leaves = u32_at(file, at + 4) as usize;
        layout.structure.extend(at..at + 8 + 4 * leaves);
        let tail = at + 8 + 4 * leaves..at + page_size;
        layout.unused.push((trunk, vec![tail]));
        for leaf in 0..leaves {
            let number = u32_at(file, at + 8 + 4 * leaf);
            layout.unused.push((number, vec![page(number)]));
            placed.insert(number);
        }
        placed.insert(trunk);
        layout.freelist_pages += 1 + leaves;
        trunk = u32_at(file, at);
    }

    // Overflow chains found in cells, walked once every b-tree page is sorted.
    let mut chains: Vec<(u32, u64)> = Vec::new();
    for number in 1..=pages as u32 {
        let start = page(number).start;
        let header = if number == 1 { start + 100 } else { start };
        let flag = file[header];
        if placed.contains(&number) || ![2, 5, 10, 13].contains(&flag) {
            continue;
        }
        placed.insert(number);
        layout.btree_pages += 1;
        let interior = flag == 2 || flag == 5;
        let header_len = if interior { 12 } else { 8 };
        let cells = u16_at(file, header + 3);
        let content = match u16_at(file, header + 5) {
            0 => 65_536,
            n => n,
        };
        let pointers_end = header + header_len + 2 * cells;
        layout.structure.extend(header..pointers_end);
        let mut unused = vec![pointers_end..start + content, start + usable..start + page_size];
        let mut freeblock = u16_at(file, header + 1);
        while freeblock != 0 {
            let at = start + freeblock;
            layout.structure.extend(at..at + 4);
            unused.push(at + 4..at + u16_at(file, at + 2));
            freeblock = u16_at(file, at);
        }
        layout.unused.push((number, unused));
        for cell in 0..cells {
            let mut at = start + u16_at(file, header + header_len + 2 * cell);
            let cell_start = at;
            if interior {
                at += 4; // the left child's page number
            }
            if flag == 5 {
                at += varint(file, at).1; // the row id
                layout.structure.extend(cell_start..at);
                continue;
            }
            let (payload, len) = varint(file, at);
            at += len;
            if flag == 13 {
                at += varint(file, at).1; // the row id
            }
            // The record header: its size, then each column's serial type.
            let (record_header, _) = varint(file, at);
            let local = local_payload(payload, usable, flag == 13);
            layout
                .structure
                .extend(cell_start..at + (record_header as usize).min(local));
            if local < payload as usize {
                let pointer = at + local;
                layout.structure.extend(pointer..pointer + 4);
                chains.push((u32_at(file, pointer), payload - local as u64));
            }
        }
    }
    for (mut next, mut left) in chains {
        while next != 0 {
            let at = page(next).start;
            layout.structure.extend(at..at + 4);
            let here = left.min((usable - 4) as u64);
            left -= here;
            let tail = at + 4 + here as usize..at + page_size;
            layout.unused.push((next, vec![tail]));
            assert!(placed.insert(next), "page {next} is in two places");
            layout.overflow_pages += 1;
            next = u32_at(file, at);
        }
    }
    let unplaced: Vec<u32> = (1..=pages as u32).filter(|n| !placed.contains(n)).collect();
    assert!(unplaced.is_empty(), "pages not sorted: {unplaced:?}");
    for (_, ranges) in &mut layout.unused {
        ranges.retain(|range| !range.is_empty());
    }
    layout.unused.retain(|(_, ranges)| !ranges.is_empty());
    layout
}

/// How many bytes of a cell's payload of `payload` bytes are on its b-tree page (the rest is
/// in overflow pages).
fn local_payload(payload: u64, usable: usize, table_leaf: bool) -> usize {
    let usable = usable as u64;
    let most = if table_leaf {
        usable - 35
    } else {
        (usable - 12) * 64 / 255 - 23
    };
    if payload <= most {
        return payload as usize;
    }
    let least = (usable - 12) * 32 / 255 - 23;
    let spill = least + (payload - least) % (usable - 4);
    (if spill <= most { spill } else { least }) as usize
}
