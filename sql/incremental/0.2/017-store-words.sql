-- storetopics 0.2: a store shows a stem in a word it writes.  The word learnt for its owner (term_words) came from the
-- texts of whichever store needed the stem first: "organize" where an anatomy store writes "organ", "responsive"
-- where a web server's manual writes "response".  Checked once per (store, stem) shown, in up to 20 of the store's
-- files that hold the stem (storetopics._learn_store_words): word NULL when the owner's word is among what they
-- write, else the word they write most (and residue as term_words has it).
CREATE TABLE storetopics.store_words (
  source_id int NOT NULL,
  store_key text NOT NULL,
  lexeme    text NOT NULL,
  word      text,
  residue   text CHECK (residue IN ('glued', 'link')),
  PRIMARY KEY (source_id, store_key, lexeme)
);
-- Where the owner's word was learnt (its first file by key that held the stem then): a store's own texts wrote
-- it, so it needs no look there.
ALTER TABLE storetopics.term_words ADD COLUMN source_id int, ADD COLUMN store_key text;
