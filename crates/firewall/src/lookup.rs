//! A set's elements made into what a `lookup` searches, matching a key as the kernel's
//! set backends match it: a plain set or map (`nft_set_hash`) by the whole key; a set of
//! intervals (`nft_set_rbtree`) by its elements' bounds, each interval from a start
//! element to the first key past it (an element flagged `NFT_SET_ELEM_INTERVAL_END`,
//! or none for an interval to the last key); a set of ranges of concatenations
//! (`nft_set_pipapo`) by each field between an element's key and its last key; and, when
//! nothing matches, the catch-all element (`*`), if any. Keys are compared as bytes, as
//! the kernel's `memcmp` compares them (data `nft` made is in network order).
//!
//! Sets whose elements time out, or that the packet path updates (`NFT_SET_TIMEOUT`,
//! `NFT_SET_EVAL`), or that hold objects, are not made into an index: their contents
//! are not the kernel's to announce, or fibre does not follow them yet.

use crate::message::{Element, Set, ELEMENT_CATCHALL, ELEMENT_INTERVAL_END};
use std::collections::HashMap;

/// `NFT_SET_INTERVAL`.
const INTERVAL: u32 = 0x4;
/// `NFT_SET_TIMEOUT`, `NFT_SET_EVAL`, `NFT_SET_OBJECT`.
const UNFOLLOWED: u32 = 0x10 | 0x20 | 0x40;

/// What a set's lookups search: each match the index of its element in the set.
#[derive(Clone, Debug)]
pub struct Index {
    /// The key's length in bytes.
    pub key_len: usize,
    kind: Kind,
    catchall: Option<u32>,
}

#[derive(Clone, Debug)]
enum Kind {
    /// Whole keys.
    Exact(HashMap<Box<[u8]>, u32, foldhash::fast::FixedState>),
    /// Interval bounds in order, each with whether it ends an interval (at one key, an
    /// end before a start, so that the start is found).
    Bounds(Vec<(Box<[u8]>, bool, u32)>),
    /// Ranges of concatenations: each field's offset and width in the key, and each
    /// element's first and last key.
    Ranges {
        fields: Vec<(usize, usize)>,
        ranges: Vec<Range>,
    },
}

/// A range of concatenations: its first key, its last, its element.
type Range = (Box<[u8]>, Box<[u8]>, u32);

impl Index {
    /// The index of `set`'s elements; why not, if fibre does not follow the set.
    pub fn new(set: &Set) -> Result<Index, String> {
        if set.flags & UNFOLLOWED != 0 {
            return Err(format!(
                "the set {} (its elements time out, are added from the packet path, or \
                 are objects)",
                set.name
            ));
        }
        if let Some(e) = set
            .elements
            .iter()
            .find(|e| e.timeout.is_some() || e.expiration.is_some())
        {
            return Err(format!(
                "the set {} (an element with a timeout: {:02x?})",
                set.name, e.key
            ));
        }
        let key_len = set.key_len as usize;
        let fits = |e: &Element| e.key.len() == key_len;
        let catchall = set
            .elements
            .iter()
            .position(|e| e.flags & ELEMENT_CATCHALL != 0)
            .map(|i| i as u32);
        let elements = set
            .elements
            .iter()
            .enumerate()
            .filter(|(_, e)| e.flags & ELEMENT_CATCHALL == 0);
        if let Some((_, odd)) = elements.clone().find(|(_, e)| !fits(e)) {
            return Err(format!(
                "the set {} (an element of {} bytes for a key of {key_len})",
                set.name,
                odd.key.len()
            ));
        }
        let kind = if set.elements.iter().any(|e| e.key_end.is_some()) {
            // Each field takes its length rounded up to a register's 4 bytes.
            let lens: Vec<usize> = if set.fields.is_empty() {
                vec![key_len]
            } else {
                set.fields.iter().map(|&l| l as usize).collect()
            };
            // The fields, each rounded up, make the key exactly (the kernel refuses a
            // set whose fields do not): anything else is not a set fibre can read.
            if lens.contains(&0)
                || lens.iter().map(|l| l.next_multiple_of(4)).sum::<usize>()
                    != key_len.next_multiple_of(4)
            {
                return Err(format!(
                    "the set {} (fields of {lens:?} bytes for a key of {key_len})",
                    set.name
                ));
            }
            let mut fields = Vec::new();
            let mut at = 0;
            for len in lens {
                let width = len.next_multiple_of(4).min(key_len - at.min(key_len));
                fields.push((at, width));
                at += len.next_multiple_of(4);
            }
            let mut ranges = Vec::new();
            for (i, e) in elements {
                let end = e.key_end.as_deref().unwrap_or(&e.key);
                if end.len() != key_len {
                    return Err(format!(
                        "the set {} (a range's end of another length)",
                        set.name
                    ));
                }
                ranges.push((e.key.clone().into(), end.into(), i as u32));
            }
            Kind::Ranges { fields, ranges }
        } else if set.flags & INTERVAL != 0 {
            let mut bounds: Vec<(Box<[u8]>, bool, u32)> = elements
                .map(|(i, e)| {
                    (
                        e.key.clone().into(),
                        e.flags & ELEMENT_INTERVAL_END != 0,
                        i as u32,
                    )
                })
                .collect();
            // By key; at one key, the end first (`false` sorts first: negated).
            bounds.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            Kind::Bounds(bounds)
        } else {
            let mut exact = HashMap::with_hasher(foldhash::fast::FixedState::default());
            for (i, e) in elements {
                exact.insert(e.key.clone().into(), i as u32);
            }
            Kind::Exact(exact)
        };
        Ok(Index {
            key_len,
            kind,
            catchall,
        })
    }

    /// The element `key` (of [`Index::key_len`] bytes) matches, other than the
    /// catch-all.
    pub fn find(&self, key: &[u8]) -> Option<u32> {
        match &self.kind {
            Kind::Exact(map) => map.get(key).copied(),
            Kind::Bounds(bounds) => {
                // The last bound at or below the key: inside if it starts an interval.
                let after = bounds.partition_point(|(b, _, _)| &b[..] <= key);
                let (_, end, i) = bounds.get(after.checked_sub(1)?)?;
                (!end).then_some(*i)
            }
            Kind::Ranges { fields, ranges } => ranges
                .iter()
                .find(|(first, last, _)| {
                    fields.iter().all(|&(at, width)| {
                        let k = &key[at..at + width];
                        k >= &first[at..at + width] && k <= &last[at..at + width]
                    })
                })
                .map(|r| r.2),
        }
    }

    /// The catch-all element, if the set has one.
    pub fn catchall(&self) -> Option<u32> {
        self.catchall
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Family;

    fn set(flags: u32, key_len: u32, elements: Vec<Element>) -> Set {
        Set {
            family: Family::Ip,
            table: "t".into(),
            name: "s".into(),
            expressions: vec![],
            flags,
            key_len,
            data_type: None,
            data_len: 0,
            fields: vec![],
            elements,
        }
    }

    fn element(key: &[u8], flags: u32) -> Element {
        Element {
            key: key.to_vec(),
            flags,
            ..Element::default()
        }
    }

    #[test]
    fn intervals_match_from_their_start_to_before_their_end() {
        // 10.0.0.0/8 and 192.168.1.0-192.168.1.255, adjacent 192.168.2.0/24, and an
        // interval to the last address.
        let s = set(
            INTERVAL,
            4,
            vec![
                element(&[10, 0, 0, 0], 0),
                element(&[11, 0, 0, 0], ELEMENT_INTERVAL_END),
                element(&[192, 168, 1, 0], 0),
                element(&[192, 168, 2, 0], ELEMENT_INTERVAL_END),
                element(&[192, 168, 2, 0], 0),
                element(&[192, 168, 3, 0], ELEMENT_INTERVAL_END),
                element(&[240, 0, 0, 0], 0),
            ],
        );
        let index = Index::new(&s).unwrap();
        let find = |k: [u8; 4]| index.find(&k);
        assert_eq!(find([10, 1, 2, 3]), Some(0));
        assert_eq!(find([11, 0, 0, 0]), None);
        assert_eq!(find([9, 255, 255, 255]), None);
        assert_eq!(find([192, 168, 2, 0]), Some(4));
        assert_eq!(find([192, 168, 1, 255]), Some(2));
        assert_eq!(find([192, 168, 3, 0]), None);
        assert_eq!(find([255, 255, 255, 255]), Some(6));
        assert_eq!(find([0, 0, 0, 0]), None);
    }

    #[test]
    fn whole_keys_ranges_of_concatenations_and_the_catchall() {
        let mut s = set(
            0,
            4,
            vec![element(&[0, 22, 0, 0], 0), element(&[], ELEMENT_CATCHALL)],
        );
        let index = Index::new(&s).unwrap();
        assert_eq!(index.find(&[0, 22, 0, 0]), Some(0));
        assert_eq!(index.find(&[0, 23, 0, 0]), None);
        assert_eq!(index.catchall(), Some(1));
        // ip saddr . tcp dport: 10.0.0.0-10.0.0.255 . 1000-2000.
        s = set(INTERVAL | 0x80, 8, vec![]);
        s.fields = vec![4, 2];
        s.elements = vec![Element {
            key: vec![10, 0, 0, 0, 0x03, 0xe8, 0, 0],
            key_end: Some(vec![10, 0, 0, 255, 0x07, 0xd0, 0, 0]),
            ..Element::default()
        }];
        let index = Index::new(&s).unwrap();
        assert_eq!(index.find(&[10, 0, 0, 7, 0x04, 0, 0, 0]), Some(0));
        // Inside as a whole key, outside by its second field.
        assert_eq!(index.find(&[10, 0, 0, 7, 0x07, 0xd1, 0, 0]), None);
        assert_eq!(index.find(&[10, 0, 1, 0, 0x04, 0, 0, 0]), None);
        // Fields that do not make the key (found by fuzzing: a field's length out of
        // any key's reach read past it), or a field of no length, are refused.
        for fields in [vec![4, 4_194_304], vec![4], vec![4, 2, 4], vec![0, 4, 4]] {
            s.fields = fields;
            assert!(Index::new(&s).is_err(), "{:?}", s.fields);
        }
        s.fields = vec![4, 2];
        // What fibre does not follow is refused.
        s.flags |= 0x10;
        assert!(Index::new(&s).is_err());
    }
}
