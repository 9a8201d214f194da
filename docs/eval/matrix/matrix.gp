set terminal pngcairo size 1400,600 font 'sans,11' noenhanced
set output 'matrix.png'
set title 'Cold attention mass recalled at R = 30 % of W, per workload variant'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set key outside right
set grid y
set yrange [0:1]
set xtics rotate by -30
set ylabel 'cold mass recalled'
plot for [i=2:6] 'matrix.dat' using i:xtic(1) title columnheader
