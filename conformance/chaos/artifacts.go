package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// writeArtifacts writes the history of a failed run beside the test's
// artifacts (go test -artifacts keeps them; see testing.T.ArtifactDir): the
// events as JSON lines, and porcupine's visualisation of the register
// history with the holds, the losses and the faults drawn in.
func writeArtifacts(t *testing.T, fam Family, events []event, faults []faultRec, r *Report) {
	dir := t.ArtifactDir()
	evPath := filepath.Join(dir, "chaos-history.jsonl")
	f, err := os.Create(evPath)
	if err != nil {
		t.Logf("chaos: cannot write the history: %v", err)
		return
	}
	enc := json.NewEncoder(f)
	for _, e := range events {
		_ = enc.Encode(e)
	}
	for _, fr := range faults {
		_ = enc.Encode(map[string]any{"fault": fr.name, "worker": fr.target.Worker, "key": fr.target.Key, "token": fr.target.Token, "start": fr.start, "end": fr.end})
	}
	_ = f.Close()

	model, ops := registerModelOps(fam, events)
	_, info := porcupine.CheckOperationsVerbose(model, ops, time.Minute)
	var notes []porcupine.Annotation
	for _, e := range events {
		switch {
		case e.Op == opAcquire && e.OK:
			notes = append(notes, porcupine.Annotation{ClientId: e.W, Start: e.Inv, End: e.Done, Description: strings.TrimSpace(fmt.Sprintf("acquire %s %s -> %d", e.Mode, e.Key, e.Tok))})
		case e.Op == opLost:
			notes = append(notes, porcupine.Annotation{ClientId: e.W, Start: e.Done, Description: "lost " + e.Key, Details: e.Err, BackgroundColor: "#f8b4b4"})
		case e.Op == opRelease:
			notes = append(notes, porcupine.Annotation{ClientId: e.W, Start: e.Inv, End: e.Done, Description: "release " + e.Key, Details: e.Err})
		}
	}
	for _, fr := range faults {
		notes = append(notes, porcupine.Annotation{Tag: "nemesis", Start: fr.start, End: fr.end, Description: fmt.Sprintf("%s on worker %d", fr.name, fr.target.Worker), BackgroundColor: "#fde68a"})
	}
	info.AddAnnotations(notes)
	htmlPath := filepath.Join(dir, "chaos-register.html")
	if err := porcupine.VisualizePath(model, info, htmlPath); err != nil {
		t.Logf("chaos: cannot write the visualisation: %v", err)
		htmlPath = "(not written)"
	}
	t.Logf("chaos: history of seed %d written to %s and %s (kept with go test -artifacts)", r.Seed, evPath, htmlPath)
}
