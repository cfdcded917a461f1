package client

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func TestRunTask(t *testing.T) {
	file := filepath.Join(t.TempDir(), "task.md")
	if err := os.WriteFile(file, []byte("Add a cache\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	loops := schemas.Pipeline{Name: "l", Source: "loops.yaml", Kind: schemas.KindLoops}
	pipeline := schemas.Pipeline{Name: "p", Source: "pipeline.yaml"}
	tests := []struct {
		name                 string
		p                    schemas.Pipeline
		task, taskFile, repo string
		want, wantErr        string
	}{
		{name: "task", p: loops, task: "Add a cache", want: "Add a cache"},
		{name: "task file", p: loops, taskFile: file, want: "Add a cache\n"},
		{name: "both", p: loops, task: "x", taskFile: file, wantErr: "not both"},
		{name: "none", p: loops, wantErr: "needs a task"},
		{name: "blank", p: loops, task: " \n", wantErr: "needs a task"},
		{name: "missing file", p: loops, taskFile: file + ".gone", wantErr: "--task-file"},
		{name: "too big", p: loops, task: strings.Repeat("x", MaxTaskBytes+1), wantErr: "over the"},
		{name: "NUL", p: loops, task: "a\x00b", wantErr: "not UTF-8 text"},
		{name: "pipeline without loops flags", p: pipeline},
		{name: "pipeline with --repo", p: pipeline, repo: ".", wantErr: "pipeline.yaml is neither"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RunTask(tt.p, tt.task, tt.taskFile, tt.repo)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrBadInput with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
