#!/usr/bin/env bash
# A silver-standard English POS task in XTREME's udpos layout, from the English side of the demo
# corpus's translation pairs, so that models pre-trained on the demo can be compared on a tagging
# task without downloads. The tags come from Lingua::EN::Tagger (Debian's
# liblingua-en-tagger-perl, a Penn Treebank HMM tagger, installed here when missing), mapped to
# UD's universal POS tags; they are a tagger's output, not human annotation, so scores measure how
# well a model learns that tagger, which is what a comparison of two encoders needs.
#
#   scripts/silver_udpos.sh [DEMO_DATA] [OUT]        (defaults: data/demo, data/silver_udpos)
#
# Writes OUT/download/udpos/{train,dev,test}-en.tsv (word<TAB>tag lines, a blank line between
# sentences; test without tags) and the test gold OUT/gold/UD_English-Silver/
# en_silver-ud-test.conllu, for finetune.data_dir=OUT/download and finetune.gold_dir=OUT/gold.
# Sentences: distinct lines of 4 to 25 words of letters (with ' and -) and final punctuation,
# shuffled with a fixed seed; 3000 train, 500 dev, 500 test.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=${1:-data/demo}
out=${2:-data/silver_udpos}
if ! perl -MLingua::EN::Tagger -e 1 2>/dev/null; then
  # apt-get update first and sudo when not root, as for the other packages.
  "$root/scripts/install_packages.sh" liblingua-en-tagger-perl
fi
shopt -s nullglob
sources=("$data"/para/*.en)
if [ ${#sources[@]} -eq 0 ]; then
  echo "silver_udpos: no $data/para/*.en files; build the demo corpus first (scripts/quickstart.sh)" >&2
  exit 1
fi
mkdir -p "$out/download/udpos" "$out/gold/UD_English-Silver"

cat "${sources[@]}" | perl -CSD -e '
use strict; use warnings;
use Lingua::EN::Tagger;
my %upos = (cc => "CCONJ", cd => "NUM", det => "DET", ex => "PRON", fw => "X", in => "ADP",
  jj => "ADJ", jjr => "ADJ", jjs => "ADJ", ls => "X", md => "AUX", nn => "NOUN", nns => "NOUN",
  nnp => "PROPN", nnps => "PROPN", pdt => "DET", pos => "PART", prp => "PRON", prps => "PRON",
  rb => "ADV", rbr => "ADV", rbs => "ADV", rp => "ADP", sym => "SYM", to => "PART", uh => "INTJ",
  vb => "VERB", vbd => "VERB", vbg => "VERB", vbn => "VERB", vbp => "VERB", vbz => "VERB",
  wdt => "DET", wp => "PRON", wps => "PRON", wrb => "ADV", pp => "PUNCT", ppc => "PUNCT",
  ppd => "PUNCT", ppl => "PUNCT", ppr => "PUNCT", pps => "PUNCT", lrb => "PUNCT", rrb => "PUNCT");
my (%seen, @lines);
while (my $line = <STDIN>) {
  chomp $line;
  $line =~ s/^\s+|\s+$//g;
  next unless $line =~ /^[A-Za-z][A-Za-z\x27\- ]*[.!?]?$/;
  my $words = () = $line =~ /\S+/g;
  next if $words < 4 || $words > 25 || $seen{lc $line}++;
  push @lines, $line;
}
# A fixed-seed Fisher-Yates shuffle (a linear congruential generator: the same on every machine).
my $state = 12345;
for (my $i = $#lines; $i > 0; --$i) {
  $state = ($state * 1103515245 + 12345) % 2147483648;
  my $j = $state % ($i + 1);
  @lines[$i, $j] = @lines[$j, $i];
}
die "silver_udpos: only " . scalar(@lines) . " usable sentences, 4000 needed\n" if @lines < 4000;
my $tagger = Lingua::EN::Tagger->new;
my %split = (train => [0, 3000], dev => [3000, 3500], test => [3500, 4000]);
my ($out) = @ARGV;
for my $name (qw(train dev test)) {
  my ($begin, $end) = @{$split{$name}};
  open my $tsv, ">", "$out/download/udpos/$name-en.tsv" or die "$out/download/udpos/$name-en.tsv: $!\n";
  my $gold;
  if ($name eq "test") {
    open $gold, ">", "$out/gold/UD_English-Silver/en_silver-ud-test.conllu" or die "gold: $!\n";
  }
  for my $n ($begin .. $end - 1) {
    my $tagged = $tagger->add_tags($lines[$n]);
    my @pairs;
    while ($tagged =~ m{<(\w+)>([^<]+)</\1>}g) { push @pairs, [$2, $upos{$1} // "X"]; }
    print {$gold} "# sent_id = silver-$n\n# text = $lines[$n]\n" if $gold;
    for my $k (0 .. $#pairs) {
      my ($word, $tag) = @{$pairs[$k]};
      print {$tsv} $name eq "test" ? "$word\n" : "$word\t$tag\n";
      print {$gold} join("\t", $k + 1, $word, "_", $tag, "_", "_", $k ? 1 : 0,
                         $k ? "dep" : "root", "_", "_"), "\n" if $gold;
    }
    print {$tsv} "\n";
    print {$gold} "\n" if $gold;
  }
  close $tsv;
}
' "$out"
echo "silver_udpos: $out/download/udpos/{train,dev,test}-en.tsv and $out/gold/UD_English-Silver/"
