// Command benchline copies `go test -bench ./bench/` output from standard
// input to standard output as it arrives and then prints, as the last
// line, the summary of bench.Summary. It exits 1 if the benchmarks failed
// or a figure is missing.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"

	"github.com/loopbus/loopbus/bench"
)

func main() {
	var all bytes.Buffer
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fmt.Println(sc.Text())
		all.Write(sc.Bytes())
		all.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "benchline:", err)
		os.Exit(1)
	}
	line, err := bench.Summary(&all)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchline:", err)
		os.Exit(1)
	}
	fmt.Println(line)
}
